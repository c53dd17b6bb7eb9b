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
  std::vector<std::pair<double, double>> pts;    // (T, tokens/s)
  std::vector<std::pair<double, double>> share;  // (T, roofline share), decode points
  std::optional<double> oom_T;                   // length that failed
  std::optional<double> last_fit_T;
};

// The i-th method's dash pattern: (colour, dash) pairs differ for the first 50 methods.
std::string dash_attr(size_t i) {
  const char* d = kDashes[(i + i / 10) % 5];
  return *d ? fmt::format(R"( stroke-dasharray="{}")", d) : std::string();
}

// x ticks at powers of two, thinned so that their labels stay apart.
std::vector<double> length_ticks(double lx0, double lx1, double width) {
  const double n = std::max(1.0, lx1 - lx0);
  int every = 1;
  while (width / n * every < 44) every *= 2;
  std::vector<double> out;
  for (double e = lx0; e <= lx1 + 1e-9; e += every) out.push_back(std::pow(2.0, e));
  return out;
}
}  // namespace

// One figure per batch size: its throughput panel (tokens/s against T, log-log; x = OOM) and, for a
// decode sweep, below it the roofline share of every point (0–100 %, further when a share passes
// 1). Every panel has its own legend of the methods, each method its own colour and dash pattern,
// the same in every panel; all panels share their axes' ranges.
std::string render_sweep_html(const Json& report) {
  if (report.value("kind", std::string()) != "sweep")
    throw InputError("plot takes a sweep report (kind \"sweep\")");
  const Json& cfg = report["config"];
  const std::string mode = cfg.value("mode", std::string("?"));
  const bool decode = mode == "decode";
  // batch -> method -> series
  std::map<int64_t, std::map<std::string, Series>> data;
  std::vector<std::string> order;  // methods in the report's order
  std::vector<std::string> notes;
  for (const auto& r : report["results"]) {
    const std::string label = label_of(r);
    if (std::find(order.begin(), order.end(), label) == order.end()) order.push_back(label);
    const std::string st = r.value("status", std::string());
    if (!r.contains("shape") || !r["shape"].contains("B") || !r["shape"].contains("T")) {
      notes.push_back(fmt::format("{}: {} ({})", label, st, r.value("reason", r.value("message", std::string()))));
      continue;
    }
    const int64_t B = r["shape"]["B"].get<int64_t>();
    const double T = r["shape"]["T"].get<double>();
    Series& s = data[B][label];
    if (st == "ok" && r.contains("tokens_per_s")) {
      s.pts.emplace_back(T, r["tokens_per_s"].get<double>());
      if (r.contains("roofline") && r["roofline"].contains("share") && r["roofline"]["share"].is_number())
        s.share.emplace_back(T, r["roofline"]["share"].get<double>());
    } else if (st == "oom") {
      s.oom_T = T;
      if (r.contains("last_fit_T") && r["last_fit_T"].is_number()) s.last_fit_T = r["last_fit_T"].get<double>();
    } else notes.push_back(fmt::format("{} B={} T={}: {} ({})", label, B, int64_t(T), st,
                                       r.value("reason", r.value("message", std::string()))));
  }
  // Axis ranges, shared by every panel (log2 lengths, log10 tokens/s, linear share).
  double tmin = INFINITY, tmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY, smax = 1;
  for (const auto& [b, per] : data)
    for (const auto& [m, s] : per) {
      for (const auto& [t, y] : s.pts) {
        tmin = std::min(tmin, t), tmax = std::max(tmax, t);
        if (y > 0) ymin = std::min(ymin, y), ymax = std::max(ymax, y);
      }
      for (const auto& [t, v] : s.share)
        if (std::isfinite(v)) smax = std::max(smax, v);
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
  smax = std::ceil(smax * 4 - 1e-9) / 4;  // 100 %, or the next quarter above the largest share
  // Panel geometry: plot area pw × ph (share panel: ph2) right of the y labels; legend on the right.
  double legend_w = 0;
  for (const auto& m : order) legend_w = std::max(legend_w, text_width(m, 12));
  // Panels are at least as tall as their legends (18 px a method), so no legend runs into the next panel.
  const double rows = 18.0 * double(order.size()) + 10;
  const double L = 80, pw = 420, ph = std::max(260.0, rows), ph2 = std::max(150.0, rows), Tp = 40, Bt = 56,
               R = 14 + 36 + legend_w + 16;
  const double W = L + pw + R, H1 = Tp + ph + Bt, H = decode ? H1 + Tp + ph2 + Bt : H1;
  auto X = [&](double t) { return L + (std::log2(t) - lx0) / (lx1 - lx0) * pw; };
  const std::vector<double> xticks = length_ticks(lx0, lx1, pw);
  auto method_index = [&](const std::string& m) {
    return size_t(std::find(order.begin(), order.end(), m) - order.begin());
  };

  // The frame, grid and x axis of a panel whose plot area starts at y0 with height h.
  auto frame = [&](std::ostringstream& svg, double y0, double h, const std::string& title, const std::string& ylabel) {
    svg << fmt::format(R"(<text class="panel-title" x="{}" y="{}" text-anchor="middle" font-size="15">{}</text>)",
                       L + pw / 2, y0 - 14, html_escape(title))
        << "\n";
    svg << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)", L, y0, pw, h) << "\n";
    for (double t : xticks) {
      const double x = X(t);
      svg << fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)", x, y0, x, y0 + h)
          << fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle">{}</text>)", x, y0 + h + 18, len_label(t)) << "\n";
    }
    svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", L + pw / 2, y0 + h + 38,
                       decode ? "context c (log2)" : "sequence length T (log2)")
        << "\n";
    svg << fmt::format(R"~(<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>)~",
                       y0 + h / 2, y0 + h / 2, ylabel)
        << "\n";
  };
  // The panel's legend: one row per method of the panel, in the page's method order.
  auto legend = [&](std::ostringstream& svg, double y0, const std::map<std::string, Series>& per, bool oom_note) {
    int row = 0;
    for (const auto& m : order) {
      auto it = per.find(m);
      if (it == per.end()) continue;
      const size_t mi = method_index(m);
      const double ly = y0 + 10 + 18 * row++;
      svg << fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)", L + pw + 14,
                         ly, L + pw + 44, ly, series_colour(mi % 10, SeriesOrder::Sweep), dash_attr(mi))
          << fmt::format(R"(<text class="legend" x="{}" y="{:.1f}">{}{}</text>)", L + pw + 50, ly + 4, html_escape(m),
                         oom_note && it->second.oom_T ? " (x = OOM)" : "")
          << "\n";
    }
  };

  std::ostringstream figs;
  if (data.empty()) {
    std::ostringstream svg;
    svg << svg_open(W, H1, R"( font-size="12")");
    frame(svg, Tp, ph, mode + " throughput", "tokens/s (log10)");
    svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no measured points</text>)", L + pw / 2, Tp + ph / 2)
        << "\n</svg>\n";
    figs << svg.str();
  }
  for (const auto& [B, per] : data) {
    std::ostringstream svg;
    svg << svg_open(W, H, R"( font-size="12")");
    // throughput
    svg << fmt::format(R"(<g class="panel" data-panel="throughput" data-batch="{}">)", B) << "\n";
    frame(svg, Tp, ph, fmt::format("{} throughput, B = {}", mode, B), "tokens/s (log10)");
    auto Y = [&](double y) { return Tp + ph - (std::log10(y) - ly0) / (ly1 - ly0) * ph; };
    for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
      const double y = Y(std::pow(10.0, e));
      svg << fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", L, y, L + pw, y)
          << fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">1e{}</text>)", L - 6, y + 4, int(e)) << "\n";
    }
    const double y_oom = Tp + ph - 8;  // the OOM x sits on the bottom axis (no throughput exists there)
    bool any_pts = false;
    for (const auto& [label, s] : per) {
      const size_t mi = method_index(label);
      const char* color = series_colour(mi % 10, SeriesOrder::Sweep);
      auto pts = s.pts;
      std::sort(pts.begin(), pts.end());
      if (!pts.empty()) {
        any_pts = true;
        std::string d;
        for (size_t i = 0; i < pts.size(); ++i)
          d += fmt::format("{}{:.1f},{:.1f}", i ? " L" : "M", X(pts[i].first), Y(std::max(pts[i].second, 1e-300)));
        svg << fmt::format(R"(<path class="series" data-method="{}" data-batch="{}" d="{}" fill="none" stroke="{}" stroke-width="2"{}/>)",
                           html_escape(label), B, d, color, dash_attr(mi))
            << "\n";
        for (const auto& [t, y] : pts)
          svg << fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>{} B={} T={}: {:.4g} tokens/s</title></circle>)",
                             X(t), Y(std::max(y, 1e-300)), color, html_escape(label), B, int64_t(t), y)
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
    }
    if (!any_pts)
      svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no measured points</text>)", L + pw / 2, Tp + ph / 2) << "\n";
    legend(svg, Tp, per, true);
    svg << "</g>\n";
    if (decode) {
      // roofline share, linear, below the throughput panel
      const double y0 = H1 + Tp;
      svg << fmt::format(R"(<g class="panel" data-panel="roofline" data-batch="{}">)", B) << "\n";
      frame(svg, y0, ph2, fmt::format("share of the copy-bandwidth roofline, B = {}", B), "roofline share");
      auto Ys = [&](double v) { return y0 + ph2 - std::clamp(v, 0.0, smax) / smax * ph2; };
      for (double q = 0; q <= smax + 1e-9; q += 0.25) {
        const double y = Ys(q);
        svg << fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="{}"{}/>)", L, y, L + pw, y,
                           std::fabs(q - 1) < 1e-9 ? "#888" : "#ddd", std::fabs(q - 1) < 1e-9 ? R"( stroke-dasharray="4,3")" : "")
            << fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">{} %</text>)", L - 6, y + 4, int(std::lround(q * 100)))
            << "\n";
      }
      bool any_share = false;
      for (const auto& [label, s] : per) {
        const size_t mi = method_index(label);
        const char* color = series_colour(mi % 10, SeriesOrder::Sweep);
        auto sh = s.share;
        std::sort(sh.begin(), sh.end());
        if (sh.empty()) continue;
        any_share = true;
        std::string d;
        for (size_t i = 0; i < sh.size(); ++i) d += fmt::format("{}{:.1f},{:.1f}", i ? " L" : "M", X(sh[i].first), Ys(sh[i].second));
        svg << fmt::format(R"(<path class="roofline" data-method="{}" data-batch="{}" d="{}" fill="none" stroke="{}" stroke-width="2"{}/>)",
                           html_escape(label), B, d, color, dash_attr(mi))
            << "\n";
        for (const auto& [t, v] : sh)
          svg << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="6" height="6" fill="{}"><title>{} B={} c={}: {:.1f} % of the copy bandwidth</title></rect>)",
                             X(t) - 3, Ys(v) - 3, color, html_escape(label), B, int64_t(t), 100 * v)
              << "\n";
      }
      if (!any_share)
        svg << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no roofline shares</text>)", L + pw / 2, y0 + ph2 / 2) << "\n";
      legend(svg, y0, per, false);
      svg << "</g>\n";
    }
    svg << "</svg>\n";
    figs << svg.str();
  }

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>mixbench sweep: " << html_escape(mode)
       << "</title>\n<style>body{font-family:sans-serif;margin:24px}td,th{padding:2px 8px;text-align:left}"
          "svg{display:inline-block;vertical-align:top;margin:0 16px 16px 0}</style></head><body>\n";
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
  if (report.contains("summary") && report["summary"].is_object()) {
    const Json& su = report["summary"];
    if (su.contains("complete") && su["complete"] == false)
      row("status", fmt::format("in progress: {} points so far (the sweep stopped or is still running; --resume continues it)",
                                report["results"].size()));
    if (su.contains("resumed_from") && su["resumed_from"].is_array() && !su["resumed_from"].empty()) {
      std::string from;
      for (const auto& f : su["resumed_from"])
        from += (from.empty() ? "" : ", ") + f.value("git_commit", std::string("?")).substr(0, 12) + " (" +
                f.value("created", std::string("?")) + ")";
      row("resumed", fmt::format("{} points kept from earlier runs: {}", su.value("kept", 0), from));
    }
  }
  if (report.contains("copy_bandwidth") && report["copy_bandwidth"].contains("bytes_per_s") &&
      report["copy_bandwidth"]["bytes_per_s"].is_number()) {
    const Json& b = report["copy_bandwidth"];
    row("copy bandwidth (roofline)", fmt::format("{:.2f} GB/s on {} (bytes read + written)", b["bytes_per_s"].get<double>() / 1e9,
                                                 b.value("device_name", b.value("device", std::string("?")))));
  }
  html << "</table>\n" << figs.str();
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

