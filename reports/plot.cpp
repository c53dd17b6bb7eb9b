#include "reports/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "harness/errors.h"
#include "reports/html.h"

namespace mixbench {

namespace {
using Json = nlohmann::json;

const char* kDashes[] = {"", "6,3", "2,3", "8,3,2,3", "12,4"};

std::string label_of(const Json& r) {
  std::string m = r.value("method", std::string("?"));
  if (r.contains("op") && r["op"].is_string()) m += "/" + r["op"].get<std::string>();
  return m;
}

std::string len_label(double t) {
  if (t >= 1048576 && std::fmod(t, 1048576) == 0) return fmt::format("{}M", int64_t(t / 1048576));
  if (t >= 1024 && std::fmod(t, 1024) == 0) return fmt::format("{}K", int64_t(t / 1024));
  return fmt::format("{}", int64_t(t));
}

struct Series {
  std::vector<std::pair<double, double>> pts;  // (T, tokens/s)
  std::optional<double> oom_T;                 // length that failed
  std::optional<double> last_fit_T;
};
}  // namespace

std::string render_sweep_html(const Json& report) {
  if (report.value("kind", std::string()) != "sweep")
    throw InputError("plot takes a sweep report (kind \"sweep\")");
  const Json& cfg = report["config"];
  const std::string mode = cfg.value("mode", std::string("?"));
  // method -> batch -> series
  std::map<std::string, std::map<int64_t, Series>> data;
  std::vector<std::string> order;
  std::vector<std::string> notes;
  for (const auto& r : report["results"]) {
    const std::string label = label_of(r);
    if (!data.count(label)) order.push_back(label);
    auto& per = data[label];
    const std::string st = r.value("status", std::string());
    if (!r.contains("shape") || !r["shape"].contains("B") || !r["shape"].contains("T")) {
      notes.push_back(fmt::format("{}: {} ({})", label, st, r.value("reason", r.value("message", std::string()))));
      continue;
    }
    const int64_t B = r["shape"]["B"].get<int64_t>();
    const double T = r["shape"]["T"].get<double>();
    Series& s = per[B];
    if (st == "ok" && r.contains("tokens_per_s")) s.pts.emplace_back(T, r["tokens_per_s"].get<double>());
    else if (st == "oom") {
      s.oom_T = T;
      if (r.contains("last_fit_T") && r["last_fit_T"].is_number()) s.last_fit_T = r["last_fit_T"].get<double>();
    } else notes.push_back(fmt::format("{} B={} T={}: {} ({})", label, B, int64_t(T), st,
                                       r.value("reason", r.value("message", std::string()))));
  }
  // Axis ranges (log2 lengths, log10 tokens/s).
  double tmin = INFINITY, tmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const auto& [m, per] : data)
    for (const auto& [b, s] : per) {
      for (const auto& [t, y] : s.pts) {
        tmin = std::min(tmin, t), tmax = std::max(tmax, t);
        if (y > 0) ymin = std::min(ymin, y), ymax = std::max(ymax, y);
      }
      if (s.oom_T) tmin = std::min(tmin, *s.oom_T), tmax = std::max(tmax, *s.oom_T);
    }
  const bool have = std::isfinite(tmin) && std::isfinite(ymin);
  if (!have) {
    tmin = 1, tmax = 2, ymin = 1, ymax = 10;
  }
  if (tmax <= tmin) tmax = tmin * 2;
  double ly0 = std::floor(std::log10(ymin)), ly1 = std::ceil(std::log10(ymax));
  if (ly1 <= ly0) ly1 = ly0 + 1;
  const double lx0 = std::log2(tmin), lx1 = std::log2(tmax);
  const double W = 860, H = 520, L = 80, R = 220, Tp = 40, Bt = 60;
  const double pw = W - L - R, ph = H - Tp - Bt;
  auto X = [&](double t) { return L + (std::log2(t) - lx0) / (lx1 - lx0) * pw; };
  auto Y = [&](double y) { return Tp + ph - (std::log10(y) - ly0) / (ly1 - ly0) * ph; };
  // The OOM x sits on the bottom axis (no throughput exists there).
  const double y_oom = Tp + ph - 8;

  std::ostringstream svg;
  svg << svg_open(W, H, R"( font-size="12")");
  svg << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)", L, Tp, pw, ph) << "\n";
  for (double e = lx0; e <= lx1 + 1e-9; e += 1) {
    const double t = std::pow(2.0, e), x = X(t);
    svg << fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)", x, Tp, x, Tp + ph)
        << fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)", x, Tp + ph + 18, len_label(t)) << "\n";
  }
  for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
    const double y = Y(std::pow(10.0, e));
    svg << fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", L, y, L + pw, y)
        << fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">1e{}</text>)", L - 6, y + 4, int(e)) << "\n";
  }
  svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">sequence length T (log2)</text>)", L + pw / 2, H - 18) << "\n";
  svg << fmt::format(R"~(<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">tokens/s (log10)</text>)~",
                     Tp + ph / 2, Tp + ph / 2)
      << "\n";
  svg << fmt::format(R"(<text x="{}" y="24" text-anchor="middle" font-size="15">{} throughput</text>)", L + pw / 2, html_escape(mode)) << "\n";

  int mi = 0, legend_row = 0;
  for (const auto& label : order) {
    const char* color = series_colour(mi, SeriesOrder::Sweep);
    int bi = 0;
    for (const auto& [B, s] : data[label]) {
      const char* dash = kDashes[bi % 5];
      auto pts = s.pts;
      std::sort(pts.begin(), pts.end());
      if (!pts.empty()) {
        std::string d;
        for (size_t i = 0; i < pts.size(); ++i)
          d += fmt::format("{}{:.1f},{:.1f}", i ? " L" : "M", X(pts[i].first), Y(std::max(pts[i].second, 1e-300)));
        svg << fmt::format(R"(<path class="series" data-method="{}" data-batch="{}" d="{}" fill="none" stroke="{}" stroke-width="2"{}/>)",
                           html_escape(label), B, d, color, *dash ? fmt::format(R"( stroke-dasharray="{}")", dash) : "")
            << "\n";
        for (const auto& [t, y] : pts)
          svg << fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>{} B={} T={}: {:.4g} tokens/s</title></circle>)",
                             X(t), Y(y), color, html_escape(label), B, int64_t(t), y)
              << "\n";
      }
      if (s.oom_T) {
        const double x = X(*s.oom_T);
        svg << fmt::format(R"(<g class="oom" data-method="{}" data-batch="{}" stroke="{}" stroke-width="2.5"><title>{} B={}: OOM at T={} (last fit {})</title>)",
                           html_escape(label), B, color, html_escape(label), B, int64_t(*s.oom_T),
                           s.last_fit_T ? std::to_string(int64_t(*s.last_fit_T)) : "none")
            << fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}"/><line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}"/></g>)",
                           x - 6, y_oom - 6, x + 6, y_oom + 6, x - 6, y_oom + 6, x + 6, y_oom - 6)
            << "\n";
      }
      const double ly = Tp + 10 + 18 * legend_row++;
      svg << fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)", L + pw + 14, ly,
                         L + pw + 44, ly, color, *dash ? fmt::format(R"( stroke-dasharray="{}")", dash) : "")
          << fmt::format(R"(<text x="{}" y="{:.1f}">{} B={}{}</text>)", L + pw + 50, ly + 4, html_escape(label), B,
                         s.oom_T ? " (x = OOM)" : "")
          << "\n";
      ++bi;
    }
    ++mi;
  }
  if (!have)
    svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no measured points</text>)", L + pw / 2, Tp + ph / 2) << "\n";
  svg << "</svg>\n";

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>mixbench sweep: " << html_escape(mode)
       << "</title>\n<style>body{font-family:sans-serif;margin:24px}td,th{padding:2px 8px;text-align:left}</style></head><body>\n";
  html << "<h1>mixbench sweep: " << html_escape(mode) << "</h1>\n<table>\n";
  auto row = [&](const char* k, const std::string& v) { html << "<tr><th>" << k << "</th><td>" << html_escape(v) << "</td></tr>\n"; };
  row("command", report.value("command", std::string()));
  row("created", report.value("created", std::string()));
  row("commit", report.value("git_commit", std::string()));
  row("level / device / dtype", cfg.value("level", std::string("?")) + " / " + cfg.value("device", std::string("?")) +
                                    " / " + cfg.value("dtype", std::string("?")));
  if (report.contains("machine")) {
    const Json& m = report["machine"];
    row("machine", m.value("cpu", std::string()) + (m.contains("gpu") && m["gpu"].is_string() ? "; " + m["gpu"].get<std::string>() : ""));
  }
  if (cfg.contains("optimizer") && cfg["optimizer"].is_string()) row("optimizer", cfg["optimizer"].get<std::string>());
  html << "</table>\n" << svg.str();
  if (!notes.empty()) {
    html << "<h2>Points without a throughput</h2>\n<ul>\n";
    for (const auto& n : notes) html << "<li>" << html_escape(n) << "</li>\n";
    html << "</ul>\n";
  }
  html << "</body></html>\n";
  return html.str();
}

bool LabelBox::intersects(const LabelBox& o) const {
  return x < o.x + o.w && o.x < x + w && y < o.y + o.h && o.y < y + h;
}

double text_width(const std::string& text, double font_size) {
  size_t chars = 0;
  for (unsigned char c : text) chars += (c & 0xC0) != 0x80;  // UTF-8 continuation bytes are not characters
  return 0.6 * font_size * double(chars);
}

std::vector<PlacedLabel> place_labels(const std::vector<std::pair<double, double>>& points,
                                      const std::vector<std::pair<double, double>>& sizes, const LabelBox& area, double marker,
                                      const std::vector<LabelBox>& obstacles) {
  if (points.size() != sizes.size())
    throw InputError(fmt::format("label placement needs one size per point ({} points, {} sizes)", points.size(), sizes.size()));
  std::vector<LabelBox> markers = obstacles;
  for (const auto& [px, py] : points) markers.push_back({px - marker, py - marker, 2 * marker, 2 * marker});
  std::vector<PlacedLabel> placed;
  const double gap = 3;
  // Directions around the point: right, left, above, below, the diagonals, then between them.
  const double kDir[][2] = {{1, 0},  {-1, 0}, {0, -1}, {0, 1},   {1, -1},  {-1, -1},   {1, 1},      {-1, 1},
                            {1, -0.5}, {-1, -0.5}, {1, 0.5}, {-1, 0.5}, {0.5, -1}, {-0.5, -1}, {0.5, 1}, {-0.5, 1}};
  for (size_t i = 0; i < points.size(); ++i) {
    const auto [px, py] = points[i];
    const auto [w, h] = sizes[i];
    // the box whose side faces the point at distance d in direction (dx, dy)
    auto candidate = [&](double dx, double dy, double d) {
      LabelBox b{0, 0, w, h};
      b.x = dx > 0 ? px + marker + gap + d * dx : dx < 0 ? px - marker - gap - w + d * dx : px - w / 2;
      b.y = dy > 0 ? py + marker + gap + d * dy : dy < 0 ? py - marker - gap - h + d * dy : py - h / 2;
      if (dx != 0 && dy == 0) b.y = py - h / 2;
      return b;
    };
    auto inside = [&](const LabelBox& b) {
      return b.x >= area.x && b.y >= area.y && b.x + b.w <= area.x + area.w && b.y + b.h <= area.y + area.h;
    };
    auto free = [&](const LabelBox& b) {
      for (const auto& p : placed)
        if (b.intersects(p.box)) return false;
      for (const auto& m : markers)
        if (b.intersects(m)) return false;
      return true;
    };
    const double step = std::max(4.0, h / 2);
    std::optional<PlacedLabel> best;
    // First pass: inside the area; second: anywhere (a crowded area), always free of the others.
    for (int pass = 0; pass < 2 && !best; ++pass)
      for (int ring = 0; ring < 400 && !best; ++ring)
        for (const auto& dir : kDir) {
          const LabelBox b = candidate(dir[0], dir[1], ring * step);
          if ((pass == 1 || inside(b)) && free(b)) {
            best = PlacedLabel{b, ring > 0};
            break;
          }
        }
    if (!best) {  // unreachable in practice: stack below everything placed so far
      double y = py;
      for (const auto& p : placed) y = std::max(y, p.box.y + p.box.h + gap);
      for (const auto& m : markers) y = std::max(y, m.y + m.h + gap);
      best = PlacedLabel{{px, y, w, h}, true};
    }
    placed.push_back(*best);
  }
  return placed;
}

}  // namespace mixbench

