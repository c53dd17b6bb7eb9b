// Tests of the leaderboard page's charts (reports/leaderboard.h): one style per method that stays
// distinct for dozens of methods and the same on every chart, labels of a column of points at one
// FLOPs/token stacked without overlaps and near their points, nice axis ticks, a y axis chosen from
// the means with the one wild interval clipped (and said so), and the baseline's own Δ shown as a
// dash rather than a zero difference with a zero-width interval.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "reports/leaderboard.h"
#include "reports/plot.h"
#include "suites/leaderboard.h"
#include "tests/leaderboard_rows.h"
#include "tests/test_util.h"

using namespace mixbench;
using Json = nlohmann::json;
using mixbench_test::count_of;

namespace {
// A per-seed train result as run_leaderboard collects it (4 steps).
Json run_row(const std::string& method, uint64_t seed, double bpb, double tps, double flops_per_token) {
  return mixbench_test::leaderboard_run_row(method, seed, bpb, tps, flops_per_token, 4);
}

// The part of `page` from the <svg> of class `cls` to its </svg>.
std::string svg_of(const std::string& page, const std::string& cls) {
  const size_t a = page.find("class=\"" + cls + "\"");
  if (a == std::string::npos) return {};
  return page.substr(a, page.find("</svg>", a) - a);
}

// m·10^k with m one of 1, 2, 2.5, 5.
bool nice_step(double step) {
  if (!(step > 0)) return false;
  const double m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-12));
  for (double n : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (std::fabs(m - n) < 1e-9 * n) return true;
  return false;
}

// A tick label ("2.5", "71.0M", "200T") as a number.
double tick_value(const std::string& label) {
  size_t used = 0;
  const double v = std::stod(label, &used);
  const std::string suffix = label.substr(used);
  if (suffix.empty()) return v;
  const std::string units = "kMGTPE";
  const size_t k = units.find(suffix);
  EXPECT_TRUE(suffix.size() == 1 && k != std::string::npos) << label;
  return v * std::pow(1000.0, double(k + 1));
}

// The segment (x1, y1)–(x2, y2) passes through the inside of `b` (shrunk by a unit: ending on its
// edge does not count), by sampling.
bool passes_through(double x1, double y1, double x2, double y2, const LabelBox& b) {
  for (int s = 0; s <= 200; ++s) {
    const double t = s / 200.0, x = x1 + t * (x2 - x1), y = y1 + t * (y2 - y1);
    if (x > b.x + 1 && x < b.x + b.w - 1 && y > b.y + 1 && y < b.y + b.h - 1) return true;
  }
  return false;
}

// The segments cross at a point inside both.
bool cross(double ax, double ay, double bx, double by, double cx, double cy, double dx, double dy) {
  auto o = [](double px, double py, double qx, double qy, double rx, double ry) {
    return (qx - px) * (ry - py) - (qy - py) * (rx - px);
  };
  const double d1 = o(cx, cy, dx, dy, ax, ay), d2 = o(cx, cy, dx, dy, bx, by);
  const double d3 = o(ax, ay, bx, by, cx, cy), d4 = o(ax, ay, bx, by, dx, dy);
  return d1 * d2 < 0 && d3 * d4 < 0;
}
}  // namespace

// ------------------------------------------------------------------ styles
TEST(LeaderboardHtml, StylesStayDistinctForFortyFiveMethods) {
  std::set<std::pair<std::string, int>> colour_marker;
  std::set<std::pair<std::string, std::string>> colour_dash;
  std::map<std::string, std::vector<SeriesStyle>> by_colour;
  std::set<std::string> colours;
  for (size_t i = 0; i < 45; ++i) {
    const SeriesStyle s = leaderboard_series_style(i);
    colour_marker.emplace(s.colour, int(s.marker));
    colour_dash.emplace(s.colour, s.dash);
    by_colour[s.colour].push_back(s);
    colours.insert(s.colour);
  }
  EXPECT_EQ(colour_marker.size(), 45u);
  EXPECT_EQ(colour_dash.size(), 45u);
  EXPECT_EQ(colours.size(), 10u);
  // two methods of one colour differ in their marker and in their dash pattern
  for (const auto& [colour, styles] : by_colour)
    for (size_t a = 0; a < styles.size(); ++a)
      for (size_t b = a + 1; b < styles.size(); ++b) {
        EXPECT_NE(styles[a].marker, styles[b].marker) << colour;
        EXPECT_NE(std::string(styles[a].dash), std::string(styles[b].dash)) << colour;
      }
  // the first ten keep tab10's colours, circles and solid lines (a page of a few methods as before)
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(leaderboard_series_style(i).marker, MarkerShape::Circle);
    EXPECT_STREQ(leaderboard_series_style(i).dash, "");
  }
}

// A page of 21 methods, 9 of them at one FLOPs/token: every loss curve has its own (colour, dash)
// and so does every legend entry; a method's colour is the same in the
// scatter plots; no two labels of a scatter plot overlap; the tick labels are nice numbers.
TEST(LeaderboardHtml, ManyMethodsKeepTheirStylesAndLabelsApart) {
  std::vector<std::string> methods;
  std::vector<Json> runs;
  for (int i = 0; i < 21; ++i) {
    const std::string m = fmt::format("method_{:02d}{}", i, std::string(size_t(i % 4) * 3, 'x'));
    methods.push_back(m);
    // nine methods at one FLOPs/token, five of them within 0.05 bpb of each other
    const double flops = i < 9 ? 7.137e7 : 7.02e7 + 2.5e5 * i;
    const double bpb = i < 5 ? 1.73 + 0.01 * i : 1.7 + 0.06 * i;
    for (uint64_t s = 1; s <= 3; ++s)
      runs.push_back(run_row(m, s, bpb + 0.01 * double(s) * (i % 3 ? 1 : -1), 3e4 + 1.3e4 * i + 500 * double(s), flops));
  }
  std::string md;
  const Json rows = leaderboard_rows(methods, runs, methods[5], md);
  const std::string page = leaderboard_html(rows, "board", {{"baseline", methods[5]}});
  // the loss curves
  const std::string loss = svg_of(page, "loss");
  std::set<std::pair<std::string, std::string>> curve_styles;
  std::map<std::string, std::string> colour_of;
  const std::regex curve(R"re(<polyline class="loss" data-method="([^"]+)" fill="none" stroke="([^"]+)" stroke-width="1.2"(?: stroke-dasharray="([^"]+)")? points=)re");
  for (auto it = std::sregex_iterator(loss.begin(), loss.end(), curve); it != std::sregex_iterator(); ++it) {
    curve_styles.emplace((*it)[2], (*it)[3]);
    colour_of[(*it)[1]] = (*it)[2];
  }
  EXPECT_EQ(curve_styles.size(), 21u);
  EXPECT_EQ(colour_of.size(), 21u);
  std::set<std::pair<std::string, std::string>> legend_styles;
  const std::regex entry(R"re(<g class="legend"><line [^>]*stroke="([^"]+)" stroke-width="1.6"(?: stroke-dasharray="([^"]+)")?/>)re");
  for (auto it = std::sregex_iterator(loss.begin(), loss.end(), entry); it != std::sregex_iterator(); ++it)
    legend_styles.emplace((*it)[1], (*it)[2]);
  EXPECT_EQ(count_of(loss, "<g class=\"legend\">"), 21u);
  EXPECT_EQ(legend_styles.size(), 21u);
  // both scatter plots: each method's error bar and point in its curve's colour, its marker shape
  // that of its style; labels apart
  for (const std::string cls : {"bpb-flops", "bpb-speed"}) {
    const std::string svg = svg_of(page, cls);
    ASSERT_FALSE(svg.empty()) << cls;
    const std::regex bar(R"re(<g class="ci" data-method="([^"]+)" stroke="([^"]+)")re");
    size_t bars = 0;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), bar); it != std::sregex_iterator(); ++it, ++bars)
      EXPECT_EQ(colour_of[(*it)[1]], (*it)[2]) << cls << " " << (*it)[1];
    EXPECT_EQ(bars, 21u) << cls;
    for (size_t i = 0; i < methods.size(); ++i) {
      const SeriesStyle s = leaderboard_series_style(i);
      const std::string tag = s.marker == MarkerShape::Circle ? "<circle" : "<path";
      EXPECT_EQ(count_of(svg, tag + " class=\"point\" data-method=\"" + methods[i] + "\" fill=\"" + s.colour + "\""), 1u)
          << cls << " " << methods[i];
    }
    // the labels as drawn: text-anchor start, end or middle on the box that text_width estimates
    std::vector<LabelBox> boxes;
    const std::regex label(R"re(<text class="label" x="([-\d.]+)" y="([-\d.]+)" font-size="10"(?: text-anchor="(end|middle)")? fill="[^"]+" [^>]*>([^<]+)</text>)re");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), label); it != std::sregex_iterator(); ++it) {
      const double w = text_width((*it)[4], 10), x = std::stod((*it)[1]), y = std::stod((*it)[2]);
      const std::string anchor = (*it)[3];
      boxes.push_back({anchor == "end" ? x - w : anchor == "middle" ? x - w / 2 : x, y + 3 - 12, w, 12});
    }
    ASSERT_EQ(boxes.size(), 21u) << cls;
    for (size_t a = 0; a < boxes.size(); ++a)
      for (size_t b = a + 1; b < boxes.size(); ++b) EXPECT_FALSE(boxes[a].intersects(boxes[b])) << cls << " " << a << " " << b;
    // the ticks: nice steps, evenly spaced
    for (const std::string axis : {"xtick", "ytick"}) {
      std::vector<double> ticks;
      const std::regex tick("<text class=\"" + axis + "\"[^>]*>([^<]+)</text>");
      for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
        ticks.push_back(tick_value((*it)[1]));
      ASSERT_GE(ticks.size(), 3u) << cls << " " << axis;
      EXPECT_LE(ticks.size(), 6u) << cls << " " << axis;
      const double step = ticks[1] - ticks[0];
      EXPECT_TRUE(nice_step(step)) << cls << " " << axis << " step " << step;
      for (size_t k = 1; k < ticks.size(); ++k) EXPECT_NEAR(ticks[k] - ticks[k - 1], step, 1e-6 * step) << cls << " " << axis;
    }
  }
}

// ------------------------------------------------------------------ label placement
TEST(LeaderboardHtml, ColumnLabelsAreStackedInOrderNearTheirPoints) {
  // nine points on one vertical (five close together, two more a bit above, one far above, one
  // far below), others around them (two close on the right), error bars as obstacles
  std::vector<std::pair<double, double>> pts = {{300, 200}, {300, 203}, {300, 205}, {300, 209}, {300, 212},
                                                {300, 160}, {300, 165}, {300, 80},  {300, 300}};
  pts.insert(pts.end(), {{330, 198}, {345, 215}, {262, 255}, {200, 150}, {420, 250}, {240, 120}});
  std::vector<std::pair<double, double>> sizes;
  for (size_t i = 0; i < pts.size(); ++i) sizes.emplace_back(text_width(fmt::format("method_{}{}", i, std::string(i % 5, 'x')), 10), 12);
  std::vector<LabelBox> bars;
  for (size_t i = 0; i < pts.size(); i += 2) bars.push_back({pts[i].first - 4, pts[i].second - 15, 8, 30});
  const LabelBox area{80, 40, 440, 300};
  const std::vector<ScatterLabel> placed = place_scatter_labels(pts, sizes, area, 5, bars);
  ASSERT_EQ(placed.size(), pts.size());
  for (size_t i = 0; i < placed.size(); ++i) {
    const LabelBox& b = placed[i].box;
    EXPECT_NEAR(b.w, sizes[i].first, 1e-12);
    EXPECT_NEAR(b.h, sizes[i].second, 1e-12);
    EXPECT_TRUE(b.x >= area.x && b.y >= area.y && b.x + b.w <= area.x + area.w && b.y + b.h <= area.y + area.h) << i;
    // near its point: the box within 70 units of it
    const double dx = std::max({b.x - pts[i].first, 0.0, pts[i].first - (b.x + b.w)});
    const double dy = std::max({b.y - pts[i].second, 0.0, pts[i].second - (b.y + b.h)});
    EXPECT_LT(std::hypot(dx, dy), 70) << i;
    for (size_t j = 0; j < placed.size(); ++j) {
      if (j != i) {
        EXPECT_FALSE(b.intersects(placed[j].box)) << i << " and " << j;
      }
      EXPECT_FALSE(b.intersects({pts[j].first - 5, pts[j].second - 5, 10, 10})) << "label " << i << " covers point " << j;
    }
    if (!placed[i].leader) continue;
    // a leader line ends on its own box's edge, passes through no other label, crosses no other leader
    EXPECT_GE(placed[i].lx, b.x - 1e-9);
    EXPECT_LE(placed[i].lx, b.x + b.w + 1e-9);
    EXPECT_GE(placed[i].ly, b.y - 1e-9);
    EXPECT_LE(placed[i].ly, b.y + b.h + 1e-9);
    for (size_t j = 0; j < placed.size(); ++j) {
      if (j == i) continue;
      EXPECT_FALSE(passes_through(pts[i].first, pts[i].second, placed[i].lx, placed[i].ly, placed[j].box))
          << "leader " << i << " through label " << j;
      if (placed[j].leader) {
        EXPECT_FALSE(cross(pts[i].first, pts[i].second, placed[i].lx, placed[i].ly, pts[j].first, pts[j].second, placed[j].lx,
                           placed[j].ly))
            << "leaders " << i << " and " << j;
      }
    }
  }
  // the five close together: one list on one side of the column, in the order of their points
  std::vector<size_t> close = {0, 1, 2, 3, 4};
  const bool right = placed[0].box.x > 300;
  for (size_t k = 0; k < close.size(); ++k) {
    const LabelBox& b = placed[close[k]].box;
    EXPECT_EQ(b.x > 300, right) << k;
    if (right) {
      EXPECT_NEAR(b.x, placed[close[0]].box.x, 1e-9) << k;  // aligned
    } else {
      EXPECT_NEAR(b.x + b.w, placed[close[0]].box.x + placed[close[0]].box.w, 1e-9) << k;
    }
    if (k > 0) {
      EXPECT_GE(b.y, placed[close[k - 1]].box.y + placed[close[k - 1]].box.h) << k;  // stacked downwards as the points go
    }
  }
  // the lone points of the column keep their labels at their own height
  for (size_t i : {size_t(7), size_t(8)}) EXPECT_NEAR(placed[i].box.y + placed[i].box.h / 2, pts[i].second, 12.0) << i;
  // twelve labels on one point and an area too small for them: still no overlap, none on a marker
  std::vector<std::pair<double, double>> same(12, {200, 150}), same_sizes;
  for (size_t i = 0; i < same.size(); ++i) same_sizes.emplace_back(text_width(fmt::format("m{}", i), 10), 12);
  for (const LabelBox& a : {area, LabelBox{190, 140, 40, 30}}) {
    const std::vector<ScatterLabel> s = place_scatter_labels(same, same_sizes, a);
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_FALSE(s[i].box.intersects({195, 145, 10, 10})) << i;
      for (size_t j = i + 1; j < s.size(); ++j) EXPECT_FALSE(s[i].box.intersects(s[j].box)) << i << " " << j;
    }
  }
  EXPECT_THROW(place_scatter_labels(pts, {}, area), InputError);
  // a long label on a point near the picture's right edge, in a plot area too small for any label:
  // every spot leaves the area, and the nearest (right of the point) would leave the picture (560
  // wide) too; with the canvas given the label goes left, above or below instead
  const std::vector<std::pair<double, double>> edge{{515, 200}};
  const std::vector<std::pair<double, double>> edge_size{{text_width("residual_standard", 10), 12}};
  const LabelBox tiny{505, 190, 20, 20};
  const std::vector<ScatterLabel> free_ = place_scatter_labels(edge, edge_size, tiny, 5, {});
  EXPECT_GT(free_[0].box.x + free_[0].box.w, 560.0) << "without a canvas the nearest spot is right of the point";
  const std::vector<ScatterLabel> kept = place_scatter_labels(edge, edge_size, tiny, 5, {}, {0, 0, 560, 400});
  EXPECT_LE(kept[0].box.x + kept[0].box.w, 560.0);
  EXPECT_GE(kept[0].box.x, 0.0);
  EXPECT_FALSE(kept[0].box.intersects({510, 195, 10, 10})) << "not on its marker";
}

// ------------------------------------------------------------------ axes
TEST(LeaderboardHtml, TicksAreNiceNumbers) {
  // the ranges of the small-rank page that gave 1.43/2.11/2.79, 0.337 and 1.79e+14
  const std::vector<std::pair<double, double>> ranges = {{1.43, 4.15},     {0.337, 5.8},   {0, 7.15e14}, {7.01e7, 7.29e7},
                                                         {1.4e4, 3.26e5}, {7.89, 7.94},   {-3, 7},      {0.001, 0.0013},
                                                         {999, 1001},     {2.5e9, 2.5e10}};
  for (const auto& [lo, hi] : ranges) {
    const AxisTicks t = nice_ticks(lo, hi);
    EXPECT_TRUE(nice_step(t.step)) << lo << " " << hi << " step " << t.step;
    EXPECT_GE(t.values.size(), 3u) << lo << " " << hi;
    EXPECT_LE(t.values.size(), 6u) << lo << " " << hi;
    ASSERT_EQ(t.labels.size(), t.values.size());
    for (size_t k = 0; k < t.values.size(); ++k) {
      const double v = t.values[k];
      EXPECT_GE(v, lo - 1e-9 * std::fabs(lo));
      EXPECT_LE(v, hi + 1e-9 * std::fabs(hi));
      EXPECT_NEAR(v / t.step, std::round(v / t.step), 1e-9) << v;  // a multiple of the step
      EXPECT_NEAR(tick_value(t.labels[k]), v, 1e-9 * std::max(1.0, std::fabs(v))) << t.labels[k];
    }
  }
  EXPECT_EQ(nice_ticks(1.43, 4.15).labels, (std::vector<std::string>{"1.5", "2.0", "2.5", "3.0", "3.5", "4.0"}));
  EXPECT_EQ(nice_ticks(0, 7.15e14).labels, (std::vector<std::string>{"0", "200T", "400T", "600T"}));
  EXPECT_EQ(nice_ticks(7.01e7, 7.29e7).labels, (std::vector<std::string>{"70.5M", "71.0M", "71.5M", "72.0M", "72.5M"}));
  EXPECT_EQ(nice_ticks(1.4e4, 3.26e5).labels, (std::vector<std::string>{"50k", "100k", "150k", "200k", "250k", "300k"}));
  EXPECT_EQ(nice_ticks(0.337, 5.8).labels, (std::vector<std::string>{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(nice_ticks(-3, 7).labels, (std::vector<std::string>{"-2", "0", "2", "4", "6"}));
  EXPECT_EQ(nice_ticks(0.3, 1.6).labels, (std::vector<std::string>{"0.50", "0.75", "1.00", "1.25", "1.50"}));
}

// One method whose seeds disagree wildly: the y axis follows the means and the ordinary intervals,
// its bar is cut at the frame with an arrowhead, and the note under the plot says so.
TEST(LeaderboardHtml, AWildIntervalIsClippedNotStretchingTheAxis) {
  std::vector<Json> runs;
  const double wild[] = {1.8, 3.9, 2.9};
  for (uint64_t s = 0; s < 3; ++s) {
    runs.push_back(run_row("base", s, 1.70 + 0.02 * double(s), 100, 7e7));
    runs.push_back(run_row("b", s, 1.80 + 0.03 * double(s), 120, 7e7));
    runs.push_back(run_row("c", s, 1.90 + 0.01 * double(s), 150, 7.1e7));
    runs.push_back(run_row("d", s, 2.10 + 0.02 * double(s), 90, 7.2e7));
    runs.push_back(run_row("wild", s, wild[s], 80, 7.15e7));
  }
  std::string md;
  const Json rows = leaderboard_rows({"base", "b", "c", "d", "wild"}, runs, "base", md);
  const double wild_hi = rows[4]["val_bpb_ci95"][1].get<double>();
  ASSERT_GT(wild_hi, 5.0);
  const std::string page = leaderboard_html(rows, "board", {{"baseline", "base"}});
  for (const std::string cls : {"bpb-flops", "bpb-speed"}) {
    const std::string svg = svg_of(page, cls);
    double top = -INFINITY;
    const std::regex tick(R"re(<text class="ytick"[^>]*>([^<]+)</text>)re");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
      top = std::max(top, tick_value((*it)[1]));
    EXPECT_LT(top, 3.5) << cls;  // the means reach 2.9, the ordinary intervals about 2.2
    EXPECT_GE(top, 2.5) << cls;
    EXPECT_EQ(count_of(svg, "<path class=\"clipped\""), 2u) << cls;  // wild's both ends lie past the frame
    EXPECT_NE(svg.find(fmt::format("wild: 95% interval [{:.4f}, {:.4f}] runs past the top and the bottom of the plot",
                                   rows[4]["val_bpb_ci95"][0].get<double>(), wild_hi)),
              std::string::npos)
        << cls;
  }
  // without it nothing is clipped and nothing noted
  std::vector<Json> tame;
  for (const Json& r : runs)
    if (r["method"] != "wild") tame.push_back(r);
  const std::string p2 = leaderboard_html(leaderboard_rows({"base", "b", "c", "d"}, tame, "base", md), "board", {{"baseline", "base"}});
  EXPECT_EQ(count_of(p2, "class=\"clipped\""), 0u);
  EXPECT_EQ(count_of(p2, "runs past the"), 0u);
}

// ------------------------------------------------------------------ tables
TEST(LeaderboardHtml, TheBaselineRowShowsADashForItsDelta) {
  std::vector<Json> runs;
  for (uint64_t s = 0; s < 3; ++s) {
    runs.push_back(run_row("base", s, 2.0 + 0.1 * double(s), 100, 7e7));
    runs.push_back(run_row("other", s, 1.9 + 0.12 * double(s), 100, 7e7));
  }
  std::string md;
  const Json rows = leaderboard_rows({"base", "other"}, runs, "base", md);
  EXPECT_NE(md.find("| base | 2.1000 ± 0.1000 | [1.8516, 2.3484] | — | — |"), std::string::npos) << md;
  EXPECT_EQ(md.find("+0.0000"), std::string::npos) << md;
  EXPECT_NE(md.find("| other | 2.0200 ± 0.1200 | [1.7219, 2.3181] | -0.0800 | [-0.1297, -0.0303] |"), std::string::npos) << md;
  const std::string page = leaderboard_html(rows, "board", {{"baseline", "base"}});
  EXPECT_NE(page.find("<td>base</td><td class=\"num\">2.1000 ± 0.1000</td><td class=\"num\">[1.8516, 2.3484]</td>"
                      "<td class=\"num\">—</td><td class=\"num\">—</td>"),
            std::string::npos);
  EXPECT_EQ(page.find("+0.0000"), std::string::npos);
  // a single seed: the baseline's Δ a dash as well
  const Json single = leaderboard_rows({"base", "other"}, {runs[0], runs[1]}, "base", md);
  EXPECT_NE(md.find("| base | 2.0000 | - | — | — |"), std::string::npos) << md;
}

// The page's loss curves: a debiased EMA, so the first point is the first loss, a constant stays
// constant, a step-to-step alternation shrinks, and a non-finite loss leaves a gap, not a jump.
TEST(LeaderboardPage, LossCurvesAreADebiasedMovingAverage) {
  using mixbench::smoothed_losses;
  const std::vector<double> flat(50, 2.5);
  for (double v : smoothed_losses(flat, 0.95)) EXPECT_NEAR(v, 2.5, 1e-12);
  std::vector<double> zig;
  for (int i = 0; i < 400; ++i) zig.push_back(i % 2 ? 4.0 : 2.0);
  const auto s = smoothed_losses(zig, 0.95);
  ASSERT_EQ(s.size(), zig.size());
  EXPECT_DOUBLE_EQ(s[0], 2.0);
  EXPECT_NEAR(s[1], (0.95 * 0.05 * 2 + 0.05 * 4) / (1 - 0.95 * 0.95), 1e-12);
  for (size_t i = 300; i < s.size(); ++i) EXPECT_NEAR(s[i], 3.0, 0.06) << i;  // ±1 shrinks to ±0.05
  const auto g = smoothed_losses({3.0, NAN, 1.0}, 0.5);
  EXPECT_DOUBLE_EQ(g[0], 3.0);
  EXPECT_TRUE(std::isnan(g[1]));
  EXPECT_NEAR(g[2], (0.5 * 0.5 * 3 + 0.5 * 1) / (1 - 0.25), 1e-12);  // as if the NaN step were not there
}
