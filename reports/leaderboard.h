// The leaderboard page, one offline HTML file (inline SVG, no scripts) built from the leaderboard's
// result rows (suites/leaderboard.h, run_leaderboard) and its summary: the ranking and probe
// tables as HTML tables, the training loss against cumulative training FLOPs per method, and val
// bpb against training FLOPs/token and against measured tokens/s as scatter plots with the 95%
// intervals as error bars, the Pareto front (lower bpb, higher tokens/s) marked, and labels placed
// so that none overlaps another label or a point (place_scatter_labels). Every method keeps one
// style (colour, marker shape, dash pattern) on all three charts.
#pragma once
#include <nlohmann/json.hpp>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "reports/plot.h"

namespace mixbench {

// `summary`: run_leaderboard's ({baseline, ...}); the baseline defaults to the row whose
// delta_vs_<name> is there.
std::string leaderboard_html(const nlohmann::json& results, const std::string& title, const nlohmann::json& summary);

// The i-th method's look on every chart of the page: its colour (the ten of tab10, in the
// leaderboard's order), and, once the colours repeat, another marker shape and dash pattern, so the
// first 50 methods differ in (colour, marker) and in (colour, dash), and two methods of one colour
// differ in both marker and dash.
enum class MarkerShape { Circle, Square, TriangleUp, Diamond, TriangleDown };
struct SeriesStyle {
  const char* colour;
  MarkerShape marker;
  const char* dash;  // stroke-dasharray of its loss curve; "" = solid
};
SeriesStyle leaderboard_series_style(size_t i);

// A training-loss curve as the page draws it: an exponential moving average with debiasing,
// s_t = (β·m_{t−1} + (1 − β)·x_t) / (1 − β^{n_t}) over the finite losses (n_t of them so far; a
// non-finite loss keeps the average and gives NaN at its step), so the first value is the first
// loss and a constant curve stays constant. β = kLossSmoothing on the page.
constexpr double kLossSmoothing = 0.95;
std::vector<double> smoothed_losses(const std::vector<double>& losses, double beta);

// Axis ticks: the multiples of the smallest step of 1, 2, 2.5 or 5 × 10^k that puts at most
// `max_ticks` of them in [lo, hi], labelled with the step's decimals and, from 1000 up, an SI
// suffix for the axis (k, M, G, T, P, E): 70.5M, 71.0M, ...; 0, 200T, 400T.
struct AxisTicks {
  double step = 0;
  std::vector<double> values;
  std::vector<std::string> labels;
};
AxisTicks nice_ticks(double lo, double hi, int max_ticks = 6);

// Label placement for the leaderboard's scatter plots (SVG units; sizes[i] = (width, height)).
// Three or more points on one vertical (within `marker` of each other in x: the same FLOPs/token,
// say) and near each other in y get a stacked list beside them, in the order of their y, each
// label as near its point's height as the others allow, with a leader line when moved. Every other
// label goes to the cheapest spot near its point: on no label, marker or leader line, its leader
// line (when it is not beside its point) crossing no label, nor within 60 units another leader
// line, and where it can, neither an obstacle (error bars) nor a marker; several orders of placing
// them are tried. No two labels intersect, and no label covers a point's marker (a square of
// ±marker), whatever the points. With a `canvas` (the SVG's box; width 0: none), no label leaves
// it where any spot inside it is free: a label may leave the plot area, not the picture.
struct ScatterLabel {
  LabelBox box;
  bool leader = false;  // a leader line from the point to (lx, ly), on the box's edge
  double lx = 0, ly = 0;
};
std::vector<ScatterLabel> place_scatter_labels(const std::vector<std::pair<double, double>>& points,
                                               const std::vector<std::pair<double, double>>& sizes, const LabelBox& area,
                                               double marker = 5, const std::vector<LabelBox>& obstacles = {},
                                               const LabelBox& canvas = {});

}  // namespace mixbench
