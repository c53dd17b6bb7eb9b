// Offline HTML page (inline SVG, no scripts) for a sweep report: one figure per batch size (small
// multiples on shared axes), its panel of throughput (tokens/s) against length, log-log, one line per
// method (its own colour and dash pattern, the same in every panel), the OOM frontier marked with an
// x, and for a decode sweep a second panel below with each point's roofline share (0-100 %).
// Every panel has its own legend; panels are <g class="panel" data-panel="throughput|roofline">.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mixbench {

// InputError when the report is not a sweep.
std::string render_sweep_html(const nlohmann::json& report);

// Label placement for scatter plots: an axis-aligned box (x, y its top-left corner, SVG units).
struct LabelBox {
  double x = 0, y = 0, w = 0, h = 0;
  bool intersects(const LabelBox& o) const;
};
struct PlacedLabel {
  LabelBox box;
  bool moved = false;  // away from the first place beside its point: draw a leader line
};
// Greedy placement, in the given order: each label goes to the first free spot on rings of growing
// distance around its point (right, left, above, below, then the diagonals and between them), one
// that lies inside `area` (when any does within the search) and intersects neither an earlier
// label's box, nor any point's marker (a square of ±marker around each point), nor an obstacle
// (error bars, say). No two returned boxes intersect, whatever the points (coincident ones
// included). sizes[i] = (width, height).
std::vector<PlacedLabel> place_labels(const std::vector<std::pair<double, double>>& points,
                                      const std::vector<std::pair<double, double>>& sizes, const LabelBox& area,
                                      double marker = 4, const std::vector<LabelBox>& obstacles = {});
// Width of `text` at `font_size` in a sans-serif font, an estimate for placement.
double text_width(const std::string& text, double font_size);

}  // namespace mixbench
