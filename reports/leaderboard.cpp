#include "reports/leaderboard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "reports/html.h"

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
}  // namespace

std::string leaderboard_html(const Json& results, const std::string& title, const std::string& markdown) {
  struct Row {
    std::string method;
    std::vector<std::pair<double, double>> loss;  // (cumulative FLOPs, loss)
    double fpt = 0, bpb = NAN;
  };
  std::vector<Row> rows;
  std::string metric = "val bpb";
  for (const auto& r : results) {
    if (r.value("status", "") != "ok") continue;
    Row row;
    row.method = r.value("method", "?");
    row.fpt = r.value("train_flops_per_token_nanochat", 0.0);
    if (r.contains("val_bpb")) row.bpb = r["val_bpb"].get<double>();
    else if (r.contains("val_bits_per_token")) {
      row.bpb = r["val_bits_per_token"].get<double>();
      metric = "val bits/token";
    }
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
  Panel a{80, 40, 440, 300, 0, 0, 0, 0}, b{660, 40, 440, 300, 0, 0, 0, 0};
  double lmin = INFINITY, lmax = -INFINITY, fmax = 0, bmin = INFINITY, bmax = -INFINITY, pmin = INFINITY, pmax = -INFINITY;
  for (const auto& r : rows) {
    for (const auto& [f, l] : r.loss) {
      fmax = std::max(fmax, f);
      lmin = std::min(lmin, l);
      lmax = std::max(lmax, l);
    }
    if (std::isfinite(r.bpb)) {
      bmin = std::min(bmin, r.bpb);
      bmax = std::max(bmax, r.bpb);
      pmin = std::min(pmin, r.fpt);
      pmax = std::max(pmax, r.fpt);
    }
  }
  a.xmin = 0;
  a.xmax = fmax > 0 ? fmax : 1;
  a.ymin = lmin;
  a.ymax = lmax;
  pad_range(a.ymin, a.ymax);
  b.xmin = pmin;
  b.xmax = pmax;
  pad_range(b.xmin, b.xmax);
  b.ymin = bmin;
  b.ymax = bmax;
  pad_range(b.ymin, b.ymax);

  std::string svg = svg_open(1200, 420);
  svg += axes(a, "cumulative training FLOPs", "training loss (nats/token)", "loss vs compute");
  svg += axes(b, "training FLOPs/token", metric, metric + " vs FLOPs/token");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const char* col = series_colour(i, SeriesOrder::Leaderboard);
    std::string pts;
    for (const auto& [f, l] : r.loss) pts += fmt::format("{:.2f},{:.2f} ", a.X(f), a.Y(l));
    if (!pts.empty()) pts.pop_back();
    svg += fmt::format("<polyline class=\"loss\" data-method=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" "
                       "points=\"{}\"/>\n",
                       html_escape(r.method), col, pts);
    if (std::isfinite(r.bpb))
      svg += fmt::format(
          "<circle class=\"bpb\" data-method=\"{0}\" cx=\"{1:.2f}\" cy=\"{2:.2f}\" r=\"4\" fill=\"{3}\"/>"
          "<text x=\"{4:.2f}\" y=\"{5:.2f}\" font-size=\"10\" fill=\"{3}\">{0} {6:.3f}</text>\n",
          html_escape(r.method), b.X(r.fpt), b.Y(r.bpb), col, b.X(r.fpt) + 6, b.Y(r.bpb) + 3, r.bpb);
    // legend under the loss panel
    const double lx = a.x0 + double(i % 4) * 110, ly = a.y0 + a.h + 50 + double(i / 4) * 14;
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.1f}\" "
                       "y=\"{:.1f}\" font-size=\"11\">{}</text>\n",
                       lx, ly - 9, col, lx + 14, ly, html_escape(r.method));
  }
  svg += "</svg>\n";
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + html_escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:1.5em}pre{background:#f6f6f6;padding:1em;"
         "overflow-x:auto}</style>\n</head>\n<body>\n<h1>" +
         html_escape(title) + "</h1>\n" + svg + "<h2>Table</h2>\n<pre>" + html_escape(markdown) + "</pre>\n</body>\n</html>\n";
}

}  // namespace mixbench
