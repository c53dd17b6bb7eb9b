#include "reports/leaderboard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "reports/html.h"
#include "reports/plot.h"
#include "suites/leaderboard.h"

namespace mixbench {

using Json = nlohmann::json;

namespace {
struct Panel {
  double x0, y0, w, h;          // plot area in SVG units
  double xmin, xmax, ymin, ymax;
  double X(double x) const { return x0 + (xmax > xmin ? (x - xmin) / (xmax - xmin) : 0.5) * w; }
  double Y(double y) const { return y0 + h - (ymax > ymin ? (y - ymin) / (ymax - ymin) : 0.5) * h; }
};

void pad_range(double& lo, double& hi) {
  if (!(hi > lo)) {
    const double m = std::isfinite(lo) ? lo : 0.0;
    lo = m - 0.5;
    hi = m + 0.5;
    return;
  }
  const double d = 0.05 * (hi - lo);
  lo -= d;
  hi += d;
}

std::string axes(const Panel& p, const std::string& xlabel, const std::string& ylabel, const std::string& title) {
  std::string s = fmt::format(
      "<g class=\"axes\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#444\"/>\n",
      p.x0, p.y0, p.w, p.h);
  for (int k = 0; k <= 4; ++k) {
    const double fx = p.xmin + (p.xmax - p.xmin) * k / 4.0, fy = p.ymin + (p.ymax - p.ymin) * k / 4.0;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{:.3g}</text>\n",
                     p.X(fx), p.y0 + p.h + 14, fx);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:.3g}</text>\n", p.x0 - 4,
                     p.Y(fy) + 3, fy);
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>\n", p.X(fx),
                     p.y0, p.y0 + p.h);
  }
  s += fmt::format("<text class=\"xlabel\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.w / 2, p.y0 + p.h + 32, html_escape(xlabel));
  s += fmt::format(
      "<text class=\"ylabel\" x=\"{0:.1f}\" y=\"{1:.1f}\" font-size=\"12\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {0:.1f} {1:.1f})\">{2}</text>\n",
      p.x0 - 44, p.y0 + p.h / 2, html_escape(ylabel));
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.w / 2, p.y0 - 8, html_escape(title));
  return s + "</g>\n";
}

// One scatter point: a method's mean with its 95% interval (NaN ends: none).
struct Dot {
  std::string method;
  const char* colour;
  double x, y, lo = NAN, hi = NAN;
  bool front = false;
};

// val bpb (y) against x, error bars from the intervals, labels placed without overlaps; with
// `pareto`, the points no other beats on both axes (lower y, higher x) ringed and joined.
std::string scatter(std::vector<Dot> dots, const std::string& xlabel, const std::string& ylabel, const std::string& title,
                    const std::string& cls, bool pareto) {
  Panel p{80, 40, 440, 300, INFINITY, -INFINITY, INFINITY, -INFINITY};
  for (const Dot& d : dots) {
    p.xmin = std::min(p.xmin, d.x);
    p.xmax = std::max(p.xmax, d.x);
    p.ymin = std::min({p.ymin, d.y, std::isfinite(d.lo) ? d.lo : d.y});
    p.ymax = std::max({p.ymax, d.y, std::isfinite(d.hi) ? d.hi : d.y});
  }
  if (dots.empty()) p.xmin = p.xmax = p.ymin = p.ymax = 0;
  pad_range(p.xmin, p.xmax);
  pad_range(p.ymin, p.ymax);
  if (pareto)
    for (Dot& d : dots)
      d.front = std::none_of(dots.begin(), dots.end(), [&](const Dot& o) {
        return o.y <= d.y && o.x >= d.x && (o.y < d.y || o.x > d.x);
      });
  std::string svg = svg_open(560, 400, " class=\"" + cls + "\"");
  svg += axes(p, xlabel, ylabel, title);
  if (pareto) {
    std::vector<const Dot*> front;
    for (const Dot& d : dots)
      if (d.front) front.push_back(&d);
    std::sort(front.begin(), front.end(), [](const Dot* a, const Dot* b) { return a->x < b->x; });
    std::string pts;
    for (const Dot* d : front) pts += fmt::format("{:.2f},{:.2f} ", p.X(d->x), p.Y(d->y));
    if (!pts.empty()) pts.pop_back();
    if (front.size() > 1)
      svg += fmt::format("<polyline class=\"pareto\" fill=\"none\" stroke=\"#999\" stroke-width=\"1.5\" stroke-dasharray=\"5,3\" "
                         "points=\"{}\"/>\n",
                         pts);
  }
  std::vector<std::pair<double, double>> at, sizes;
  std::vector<LabelBox> bars;  // the error bars: no label on them
  for (const Dot& d : dots) {
    const double cx = p.X(d.x), cy = p.Y(d.y);
    at.emplace_back(cx, cy);
    sizes.emplace_back(text_width(d.method, 10), 12);
    if (std::isfinite(d.lo) && std::isfinite(d.hi)) bars.push_back({cx - 4, p.Y(d.hi), 8, p.Y(d.lo) - p.Y(d.hi)});
    if (std::isfinite(d.lo) && std::isfinite(d.hi))
      svg += fmt::format(
          "<g class=\"ci\" data-method=\"{0}\" stroke=\"{1}\" stroke-width=\"1.2\"><line x1=\"{2:.2f}\" x2=\"{2:.2f}\" "
          "y1=\"{3:.2f}\" y2=\"{4:.2f}\"/><line x1=\"{5:.2f}\" x2=\"{6:.2f}\" y1=\"{3:.2f}\" y2=\"{3:.2f}\"/>"
          "<line x1=\"{5:.2f}\" x2=\"{6:.2f}\" y1=\"{4:.2f}\" y2=\"{4:.2f}\"/></g>\n",
          html_escape(d.method), d.colour, cx, p.Y(d.lo), p.Y(d.hi), cx - 4, cx + 4);
    if (d.front)
      svg += fmt::format("<circle class=\"front\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"7.5\" fill=\"none\" stroke=\"#222\" "
                         "stroke-width=\"1.5\"/>\n",
                         cx, cy);
    svg += fmt::format("<circle class=\"point\" data-method=\"{0}\" cx=\"{1:.2f}\" cy=\"{2:.2f}\" r=\"4\" fill=\"{3}\">"
                       "<title>{0}: {4:.4f}</title></circle>\n",
                       html_escape(d.method), cx, cy, d.colour, d.y);
  }
  const std::vector<PlacedLabel> labels = place_labels(at, sizes, {p.x0, p.y0, p.w, p.h}, 4, bars);
  for (size_t i = 0; i < dots.size(); ++i) {
    const LabelBox& b = labels[i].box;
    if (labels[i].moved) {  // a leader line from the point to the nearest point of the label's box
      const double lx = std::clamp(at[i].first, b.x, b.x + b.w), ly = std::clamp(at[i].second, b.y, b.y + b.h);
      svg += fmt::format("<line class=\"leader\" x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"#888\" "
                         "stroke-width=\"0.8\"/>\n",
                         at[i].first, at[i].second, lx, ly);
    }
    svg += fmt::format("<text class=\"label\" x=\"{:.2f}\" y=\"{:.2f}\" font-size=\"10\" fill=\"{}\" stroke=\"#fff\" "
                       "stroke-width=\"3\" paint-order=\"stroke\">{}</text>\n", b.x,
                       b.y + b.h - 3, dots[i].colour, html_escape(dots[i].method));
  }
  if (pareto)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#444\">ringed, dashed: the Pareto front (lower bpb, "
                       "higher tokens/s)</text>\n",
                       p.x0, p.y0 + p.h + 48);
  return svg + "</svg>\n";
}

std::string html_table(const TextTable& t, const std::string& cls) {
  std::string s = "<table class=\"" + cls + "\">\n<thead><tr>";
  for (size_t i = 0; i < t.header.size(); ++i)
    s += std::string(t.right[i] ? "<th class=\"num\">" : "<th>") + html_escape(t.header[i]) + "</th>";
  s += "</tr></thead>\n<tbody>\n";
  for (size_t r = 0; r < t.rows.size(); ++r) {
    s += t.tie[r] ? "<tr class=\"tie\">" : "<tr>";
    for (size_t i = 0; i < t.rows[r].size(); ++i)
      s += std::string(t.right[i] ? "<td class=\"num\">" : "<td>") + html_escape(t.rows[r][i]) + "</td>";
    s += "</tr>\n";
  }
  return s + "</tbody>\n</table>\n";
}

// One ranking's table, scatter plots and loss curves (with its probes and failures).
std::string ranking_section(const Json& results, const Json& summary) {
  struct Row {
    std::string method;
    std::vector<std::pair<double, double>> loss;  // (cumulative FLOPs, loss)
    double fpt = 0, bpb = NAN, lo = NAN, hi = NAN, tps = NAN;
  };
  std::vector<Row> rows;
  std::string metric = "val bpb", key = "val_bpb";
  std::string baseline = summary.value("baseline", std::string());
  for (const auto& r : results) {
    if (r.value("status", "") != "ok") continue;
    Row row;
    row.method = r.value("method", "?");
    row.fpt = r.value("train_flops_per_token_nanochat", 0.0);
    if (r.contains("val_bits_per_token")) {
      metric = "val bits/token";
      key = "val_bits_per_token";
    }
    if (r.contains(key)) row.bpb = r[key].get<double>();
    if (r.contains(key + "_ci95") && r[key + "_ci95"].is_array()) {
      row.lo = r[key + "_ci95"][0].get<double>();
      row.hi = r[key + "_ci95"][1].get<double>();
    }
    if (r.contains("tokens_per_s") && r["tokens_per_s"].is_number()) row.tps = r["tokens_per_s"].get<double>();
    if (baseline.empty())
      for (const auto& [k, v] : r.items())
        if (k.rfind("delta_vs_", 0) == 0 && k.find("_ci95") == std::string::npos && v == 0.0) baseline = k.substr(9);
    const auto losses = r.value("loss_curve", std::vector<double>{});
    const int64_t steps = r.value("steps", int64_t(losses.size()));
    const double tokens_per_step = steps > 0 ? double(r.value("tokens", int64_t(0))) / double(steps) : 0.0;
    const size_t stride = std::max<size_t>(1, losses.size() / 400);
    for (size_t i = 0; i < losses.size(); i += stride)
      if (std::isfinite(losses[i])) row.loss.emplace_back(double(i + 1) * tokens_per_step * row.fpt, losses[i]);
    if (!losses.empty() && (losses.size() - 1) % stride != 0 && std::isfinite(losses.back()))
      row.loss.emplace_back(double(losses.size()) * tokens_per_step * row.fpt, losses.back());
    rows.push_back(std::move(row));
  }
  // The loss curves, with the legend under them.
  Panel a{80, 40, 440, 300, 0, 0, 0, 0};
  double lmin = INFINITY, lmax = -INFINITY, fmax = 0;
  for (const auto& r : rows)
    for (const auto& [f, l] : r.loss) {
      fmax = std::max(fmax, f);
      lmin = std::min(lmin, l);
      lmax = std::max(lmax, l);
    }
  a.xmax = fmax > 0 ? fmax : 1;
  a.ymin = lmin;
  a.ymax = lmax;
  pad_range(a.ymin, a.ymax);
  const double legend_rows = double((rows.size() + 3) / 4);  // four methods a row, 14 units apart, from y = 390
  std::string loss_svg = svg_open(560, 400 + 14 * std::max(0.0, legend_rows - 1), " class=\"loss\"");
  loss_svg += axes(a, "cumulative training FLOPs", "training loss (nats/token)", "loss vs compute (first seed)");
  std::vector<Dot> by_flops, by_speed;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const char* col = series_colour(i, SeriesOrder::Leaderboard);
    std::string pts;
    for (const auto& [f, l] : r.loss) pts += fmt::format("{:.2f},{:.2f} ", a.X(f), a.Y(l));
    if (!pts.empty()) pts.pop_back();
    loss_svg += fmt::format("<polyline class=\"loss\" data-method=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" "
                            "points=\"{}\"/>\n",
                            html_escape(r.method), col, pts);
    const double lx = a.x0 + double(i % 4) * 110, ly = a.y0 + a.h + 50 + double(i / 4) * 14;
    loss_svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1f}\" "
                            "y=\"{:.1f}\" font-size=\"11\">{}</text>\n",
                            lx, ly - 9, col, lx + 14, ly, html_escape(r.method));
    if (!std::isfinite(r.bpb)) continue;
    by_flops.push_back({r.method, col, r.fpt, r.bpb, r.lo, r.hi});
    if (std::isfinite(r.tps)) by_speed.push_back({r.method, col, r.tps, r.bpb, r.lo, r.hi});
  }
  loss_svg += "</svg>\n";
  const LeaderboardTables t = leaderboard_tables(results, baseline);
  std::string body = "<p class=\"note\">" + html_escape(t.note) + "</p>\n" + html_table(t.ranking, "ranking");
  if (!t.tie_note.empty()) body += "<p class=\"note\">" + html_escape(t.tie_note) + "</p>\n";
  body += "<div class=\"plots\">\n" + scatter(by_flops, "training FLOPs/token", metric, metric + " vs FLOPs/token", "bpb-flops", false) +
          scatter(by_speed, "measured tokens/s", metric, metric + " vs tokens/s", "bpb-speed", true) + loss_svg + "</div>\n";
  if (!t.probes.header.empty()) body += "<h2>Capability probes (accuracy)</h2>\n" + html_table(t.probes, "probes");
  if (!t.errors.empty()) {
    body += "<h2>Failed</h2>\n<ul>\n";
    for (const auto& e : t.errors) body += "<li>" + html_escape(e) + "</li>\n";
    body += "</ul>\n";
  }
  return body;
}
}  // namespace

std::string leaderboard_html(const Json& results, const std::string& title, const Json& summary) {
  // With several budgets (--budgets) every row carries its budget: one section per budget, in the
  // order they appear, then Kendall's τ between them.
  // A method that failed has no budget of its own: it is listed as failed under every budget.
  std::vector<std::pair<std::string, Json>> parts;
  std::vector<Json> unbudgeted_failures;
  for (const auto& r : results) {
    const Json b = r.value("budget", Json());
    const std::string label = b.is_object() ? b.value("budget", std::string()) : std::string();
    if (label.empty() && r.value("status", std::string("ok")) != "ok") {
      unbudgeted_failures.push_back(r);
      continue;
    }
    auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& p) { return p.first == label; });
    if (it == parts.end()) {
      parts.emplace_back(label, Json::array());
      it = parts.end() - 1;
    }
    it->second.push_back(r);
  }
  if (parts.empty()) parts.emplace_back(std::string(), Json::array());
  for (auto& [label, rows] : parts)
    for (const Json& r : unbudgeted_failures) rows.push_back(r);
  std::string body;
  if (parts.size() <= 1) {
    body = ranking_section(parts.front().second, summary);
  } else {
    for (const auto& [label, rows] : parts) {
      std::string heading = label.empty() ? std::string("without a budget") : "budget " + label;
      for (const auto& r : rows)
        if (r.contains("budget") && r["budget"].is_object() && r["budget"].contains("steps") && r["budget"].contains("tokens")) {
          heading += fmt::format(" ({} steps, {} tokens)", r["budget"]["steps"].get<int64_t>(), r["budget"]["tokens"].get<int64_t>());
          break;
        }
      body += "<h2>" + html_escape(heading) + "</h2>\n" + ranking_section(rows, summary);
    }
    if (summary.contains("kendall_tau") && summary["kendall_tau"].is_array() && !summary["kendall_tau"].empty()) {
      body += "<h2>Agreement between budgets</h2>\n<table class=\"tau\">\n<thead><tr><th>budgets</th><th class=\"num\">Kendall "
              "τ-b</th><th class=\"num\">methods</th></tr></thead>\n<tbody>\n";
      for (const auto& t : summary["kendall_tau"])
        body += fmt::format("<tr><td>{} vs {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
                            html_escape(t.value("a", std::string())), html_escape(t.value("b", std::string())),
                            t.contains("tau") && t["tau"].is_number() ? fmt::format("{:.3f}", t["tau"].get<double>()) : "-",
                            t.value("methods", int64_t(0)));
      body += "</tbody>\n</table>\n";
    }
  }
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + html_escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:0.5em 0;font-size:13px}"
         "th,td{padding:2px 6px;border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}th.num,td.num{text-align:right}"
         "tr.tie td{background:#fff6e0}.note{color:#444}.plots svg{margin:0.5em 1em 0.5em 0;vertical-align:top}</style>\n"
         "</head>\n<body>\n<h1>" +
         html_escape(title) + "</h1>\n" + body + "</body>\n</html>\n";
}

}  // namespace mixbench
