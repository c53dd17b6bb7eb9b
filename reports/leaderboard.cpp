#include "reports/leaderboard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/errors.h"
#include "reports/html.h"
#include "reports/plot.h"
#include "suites/leaderboard.h"

namespace mixbench {

using Json = nlohmann::json;

SeriesStyle leaderboard_series_style(size_t i) {
  // One marker and one dash per round of the ten colours: methods i and i + 10k (k < 5) share a
  // colour and differ in both, so a legend entry or a label's point is never ambiguous.
  static const MarkerShape kMarkers[] = {MarkerShape::Circle, MarkerShape::Square, MarkerShape::TriangleUp,
                                         MarkerShape::Diamond, MarkerShape::TriangleDown};
  static const char* const kDashes[] = {"", "6,3", "2,2", "8,3,2,3", "12,4"};
  const size_t round = (i / 10) % 5;
  return {series_colour(i, SeriesOrder::Leaderboard), kMarkers[round], kDashes[round]};
}

AxisTicks nice_ticks(double lo, double hi, int max_ticks) {
  AxisTicks t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return t;
  if (hi < lo) std::swap(lo, hi);
  max_ticks = std::max(max_ticks, 2);
  const double span = hi > lo ? hi - lo : std::max(std::fabs(lo), 1.0);
  // step = m·10^e, computed as a division for negative e so that 0.1·3 prints as 0.3
  auto value = [](double k, double m, int e) { return e < 0 ? k * m / std::pow(10.0, -e) : k * m * std::pow(10.0, e); };
  double mant = 1;
  int exp10 = 0;
  for (int e = int(std::floor(std::log10(span / max_ticks))) - 1; !(t.step > 0); ++e)
    for (double m : {1.0, 2.0, 2.5, 5.0}) {
      const double s = value(1, m, e);
      if (std::floor(hi / s + 1e-9) - std::ceil(lo / s - 1e-9) + 1 <= max_ticks) {
        t.step = s, mant = m, exp10 = e;
        break;
      }
    }
  for (double k = std::ceil(lo / t.step - 1e-9); k <= std::floor(hi / t.step + 1e-9); ++k)
    t.values.push_back(k == 0 ? 0.0 : value(k, mant, exp10));
  // one scale and one number of decimals for the whole axis
  double maxabs = 0;
  for (double v : t.values) maxabs = std::max(maxabs, std::fabs(v));
  const int group = maxabs >= 1000 ? std::min(6, int(std::floor(std::log10(maxabs) / 3 + 1e-9))) : 0;
  const double scale = std::pow(1000.0, group);
  const std::string suffix = group > 0 ? std::string(1, "kMGTPE"[group - 1]) : std::string();
  int decimals = 0;
  for (double s = t.step / scale; decimals < 12 && std::fabs(s - std::round(s)) > 1e-6 * std::max(1.0, s); s *= 10) ++decimals;
  for (double v : t.values)
    t.labels.push_back(v == 0 ? fmt::format("{:.{}f}", 0.0, decimals) : fmt::format("{:.{}f}{}", v / scale, decimals, suffix));
  return t;
}

namespace {
struct Seg {
  double x1, y1, x2, y2;
};

double orient(double ax, double ay, double bx, double by, double cx, double cy) {
  return (bx - ax) * (cy - ay) - (by - ay) * (cx - ax);
}

// The segments cross at a point inside both (touching or sharing an end is no crossing).
bool segments_cross(const Seg& a, const Seg& b) {
  const double d1 = orient(b.x1, b.y1, b.x2, b.y2, a.x1, a.y1), d2 = orient(b.x1, b.y1, b.x2, b.y2, a.x2, a.y2);
  const double d3 = orient(a.x1, a.y1, a.x2, a.y2, b.x1, b.y1), d4 = orient(a.x1, a.y1, a.x2, a.y2, b.x2, b.y2);
  return ((d1 > 0 && d2 < 0) || (d1 < 0 && d2 > 0)) && ((d3 > 0 && d4 < 0) || (d3 < 0 && d4 > 0));
}

// Some part of the segment lies inside the box shrunk by half a unit (Liang–Barsky): a leader line
// that ends on its label's edge does not hit it.
bool segment_hits_box(const Seg& s, const LabelBox& b) {
  const double e = 0.5, dx = s.x2 - s.x1, dy = s.y2 - s.y1;
  if (b.w <= 2 * e || b.h <= 2 * e) return false;
  const double p[4] = {-dx, dx, -dy, dy};
  const double q[4] = {s.x1 - (b.x + e), (b.x + b.w - e) - s.x1, s.y1 - (b.y + e), (b.y + b.h - e) - s.y1};
  double t0 = 0, t1 = 1;
  for (int k = 0; k < 4; ++k) {
    if (p[k] == 0) {
      if (q[k] < 0) return false;
      continue;
    }
    const double t = q[k] / p[k];
    if (p[k] < 0) t0 = std::max(t0, t);
    else t1 = std::min(t1, t);
    if (t0 > t1) return false;
  }
  return true;
}

// Spreads labels of heights h (sorted by their wanted centres c) apart by `gap` with the least
// total squared displacement, kept within [top, bottom] where they fit: runs of overlapping labels
// merge into blocks, each centred on its members' wishes. Returns the boxes' tops.
std::vector<double> spread(const std::vector<double>& c, const std::vector<double>& h, double gap, double top, double bottom) {
  struct Block {
    size_t first, last;
    double height, wish_sum;  // wish: a member's wanted block top (its wanted top less its offset in the block)
    double top;
  };
  std::vector<Block> blocks;
  auto settle = [&](Block& b) {
    b.top = b.wish_sum / double(b.last - b.first + 1);
    b.top = std::max(top, std::min(b.top, bottom - b.height));
  };
  for (size_t i = 0; i < c.size(); ++i) {
    blocks.push_back({i, i, h[i], c[i] - h[i] / 2, 0});
    settle(blocks.back());
    while (blocks.size() > 1) {
      Block& a = blocks[blocks.size() - 2];
      const Block& b = blocks.back();
      if (a.top + a.height + gap <= b.top + 1e-9) break;
      // b's members sit below a's: their offsets grow by a's height and the gap
      a.wish_sum += b.wish_sum - double(b.last - b.first + 1) * (a.height + gap);
      a.height += gap + b.height;
      a.last = b.last;
      blocks.pop_back();
      settle(blocks.back());
    }
  }
  std::vector<double> tops(c.size());
  for (const Block& b : blocks) {
    double y = b.top;
    for (size_t i = b.first; i <= b.last; ++i) {
      tops[i] = y;
      y += h[i] + gap;
    }
  }
  return tops;
}
}  // namespace

std::vector<ScatterLabel> place_scatter_labels(const std::vector<std::pair<double, double>>& points,
                                               const std::vector<std::pair<double, double>>& sizes, const LabelBox& area,
                                               double marker, const std::vector<LabelBox>& obstacles,
                                               const LabelBox& canvas) {
  if (points.size() != sizes.size())
    throw InputError(fmt::format("label placement needs one size per point ({} points, {} sizes)", points.size(), sizes.size()));
  const size_t n = points.size();
  const double gap = 3;
  std::vector<LabelBox> marks;
  for (const auto& [px, py] : points) marks.push_back({px - marker, py - marker, 2 * marker, 2 * marker});
  std::vector<std::optional<ScatterLabel>> out(n);
  std::vector<LabelBox> placed;  // every label so far
  std::vector<Seg> leaders;      // and their leader lines, from the markers' edges
  // The leader line from point i to (lx, ly), less the part inside i's own marker; none when that
  // is all of it.
  auto leader_of = [&](size_t i, double lx, double ly) -> std::optional<Seg> {
    const auto [px, py] = points[i];
    const double d = std::hypot(lx - px, ly - py);
    if (d <= marker) return std::nullopt;
    return Seg{px + (lx - px) / d * marker, py + (ly - py) / d * marker, lx, ly};
  };
  auto inside = [&](const LabelBox& b) {
    return b.x >= area.x && b.y >= area.y && b.x + b.w <= area.x + area.w && b.y + b.h <= area.y + area.h;
  };
  // What a label at `b` with leader `seg` costs: infinite when it would overlap a label or a point's
  // marker, sit on a leader line, or have its leader cross a label (or, `strict`, another leader or
  // another point's marker: a point caged by leader lines could only reach out across one); otherwise
  // a price for every error bar it covers, every leader line or marker its leader crosses, and for
  // leaving the plot area.
  auto on_canvas = [&](const LabelBox& b) {
    return canvas.w <= 0 || (b.x >= canvas.x && b.y >= canvas.y && b.x + b.w <= canvas.x + canvas.w &&
                             b.y + b.h <= canvas.y + canvas.h);
  };
  auto cost_of = [&](size_t i, const LabelBox& b, const std::optional<Seg>& seg, bool strict) {
    if (!on_canvas(b)) return double(INFINITY);
    for (const LabelBox& q : placed)
      if (b.intersects(q)) return double(INFINITY);
    for (const LabelBox& m : marks)
      if (b.intersects(m)) return double(INFINITY);
    for (const Seg& l : leaders)
      if (segment_hits_box(l, b)) return double(INFINITY);
    double c = inside(b) ? 0.0 : 200.0;
    for (const LabelBox& o : obstacles)
      if (b.intersects(o)) c += 10;
    if (seg) {
      for (const LabelBox& q : placed)
        if (segment_hits_box(*seg, q)) return double(INFINITY);
      for (const Seg& l : leaders)
        if (segments_cross(*seg, l)) {
          if (strict) return double(INFINITY);
          c += 30;
        }
      for (size_t j = 0; j < n; ++j)
        if (j != i && segment_hits_box(*seg, marks[j])) {
          if (strict) return double(INFINITY);
          c += 20;
        }
      for (const LabelBox& o : obstacles)
        if (segment_hits_box(*seg, o)) c += 5;
    }
    return c;
  };
  auto commit = [&](size_t i, const ScatterLabel& l) {
    placed.push_back(l.box);
    if (l.leader)
      if (auto s = leader_of(i, l.lx, l.ly)) leaders.push_back(*s);
    out[i] = l;
  };

  // Columns: runs of points (in x order) within `marker` of the run's first point's x, cut where
  // two neighbours in y lie too far apart for their labels to meet; each part of three or more gets
  // its own list (two find their places as well one by one). The largest first, as they need the
  // most room.
  std::vector<size_t> by_x(n);
  std::iota(by_x.begin(), by_x.end(), size_t(0));
  std::stable_sort(by_x.begin(), by_x.end(), [&](size_t a, size_t b) { return points[a].first < points[b].first; });
  std::vector<std::vector<size_t>> columns;
  for (size_t k = 0; k < n;) {
    size_t e = k + 1;
    while (e < n && points[by_x[e]].first - points[by_x[k]].first <= marker) ++e;
    std::vector<size_t> col(by_x.begin() + long(k), by_x.begin() + long(e));
    std::stable_sort(col.begin(), col.end(), [&](size_t a, size_t b) { return points[a].second < points[b].second; });
    for (size_t f = 0; f < col.size();) {
      size_t g = f + 1;
      while (g < col.size() &&
             points[col[g]].second - points[col[g - 1]].second < 1.5 * std::max(sizes[col[g]].second, sizes[col[g - 1]].second))
        ++g;
      if (g - f > 2) columns.emplace_back(col.begin() + long(f), col.begin() + long(g));
      f = g;
    }
    k = e;
  }
  std::stable_sort(columns.begin(), columns.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const auto& col : columns) {
    double xlo = INFINITY, xhi = -INFINITY;
    std::vector<double> wish, hs;
    for (size_t i : col) {
      xlo = std::min(xlo, points[i].first);
      xhi = std::max(xhi, points[i].first);
      wish.push_back(points[i].second);
      hs.push_back(sizes[i].second);
    }
    const std::vector<double> tops = spread(wish, hs, 1, area.y, area.y + area.h);
    bool displaced = false;
    for (size_t k = 0; k < col.size(); ++k) displaced = displaced || std::fabs(tops[k] + hs[k] / 2 - wish[k]) > 1;
    // The list right of the column or left of it, further out when that is cheaper (but for a leader
    // line's room no nearer than 10 when a label had to move); its leaders crossing no other where
    // that can be.
    double best = INFINITY;
    std::vector<ScatterLabel> chosen;
    for (bool strict : {true, false}) {
      if (std::isfinite(best)) break;  // the strict pass found a place
      for (int side : {1, -1})
        for (double off : {0.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0}) {
          if (displaced && off == 0) continue;
          double cost = off + (side < 0 ? 4.0 : 0.0);
          std::vector<ScatterLabel> ls;
          for (size_t k = 0; k < col.size() && std::isfinite(cost); ++k) {
            const size_t i = col[k];
            const double w = sizes[i].first;
            ScatterLabel l;
            l.box = {side > 0 ? xhi + marker + gap + off : xlo - marker - gap - off - w, tops[k], w, hs[k]};
            l.leader = off > 0 || std::fabs(tops[k] + hs[k] / 2 - wish[k]) > 1;
            l.lx = side > 0 ? l.box.x : l.box.x + w;
            l.ly = l.box.y + l.box.h / 2;
            cost += cost_of(i, l.box, l.leader ? leader_of(i, l.lx, l.ly) : std::nullopt, strict) +
                    0.1 * std::fabs(l.ly - wish[k]);
            ls.push_back(l);
          }
          if (cost < best) {
            best = cost;
            chosen = ls;
          }
        }
    }
    if (std::isfinite(best))
      for (size_t k = 0; k < col.size(); ++k) commit(col[k], chosen[k]);
  }

  // Every other label: the cheapest spot on rings of growing distance around its point (right,
  // left, above, below, the diagonals, then between them), a ring's distance counting as its price,
  // so a farther spot wins only when it is that much freer. Within 60 units its leader crosses no
  // other; past them, where nothing nearer is free, it may.
  const double kDir[][2] = {{1, 0},  {-1, 0},   {0, -1},  {0, 1},    {1, -1},   {-1, -1},   {1, 1},    {-1, 1},
                            {1, -0.5}, {-1, -0.5}, {1, 0.5}, {-1, 0.5}, {0.5, -1}, {-0.5, -1}, {0.5, 1}, {-0.5, 1}};
  auto place_one = [&](size_t i) {
    const auto [px, py] = points[i];
    const auto [w, h] = sizes[i];
    const double step = std::max(4.0, h / 2);
    double best = INFINITY;
    ScatterLabel chosen;
    for (bool strict : {true, false}) {
      if (std::isfinite(best)) break;  // the strict pass found a spot
      for (int ring = 0; ring < 400 && best > ring * step && !(strict && ring * step > 60); ++ring)
        for (size_t k = 0; k < std::size(kDir); ++k) {
          const double dx = kDir[k][0], dy = kDir[k][1], d = ring * step;
          LabelBox b{0, 0, w, h};
          b.x = dx > 0 ? px + marker + gap + d * dx : dx < 0 ? px - marker - gap - w + d * dx : px - w / 2;
          b.y = dy > 0 ? py + marker + gap + d * dy : dy < 0 ? py - marker - gap - h + d * dy : py - h / 2;
          if (dx != 0 && dy == 0) b.y = py - h / 2;
          ScatterLabel l{b, ring > 0, std::clamp(px, b.x, b.x + w), std::clamp(py, b.y, b.y + h)};
          const double c = cost_of(i, b, l.leader ? leader_of(i, l.lx, l.ly) : std::nullopt, strict) + d + 0.25 * double(k);
          if (c < best) {
            best = c;
            chosen = l;
          }
        }
    }
    if (!std::isfinite(best)) {  // unreachable in practice: below everything placed so far
      double y = py;
      for (const LabelBox& q : placed) y = std::max(y, q.y + q.h + gap);
      for (const LabelBox& m : marks) y = std::max(y, m.y + m.h + gap);
      chosen = {{px, y, w, h}, true, px, y};
      best = 1e9;
    }
    commit(i, chosen);
    return best;
  };
  // Greedy placement depends on the order: several are tried (the most crowded first, the given
  // order, by x and by y both ways) and the cheapest layout kept.
  std::vector<size_t> crowd(n, 0), rest;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j)
      crowd[i] += j != i && std::hypot(points[j].first - points[i].first, points[j].second - points[i].second) < 40;
    if (!out[i]) rest.push_back(i);
  }
  std::vector<std::vector<size_t>> orders(6, rest);
  std::stable_sort(orders[0].begin(), orders[0].end(), [&](size_t a, size_t b) { return crowd[a] > crowd[b]; });
  for (int axis = 0; axis < 2; ++axis) {
    auto coord = [&](size_t i) { return axis ? points[i].second : points[i].first; };
    auto& up = orders[size_t(2 + 2 * axis)];
    auto& down = orders[size_t(3 + 2 * axis)];
    std::stable_sort(up.begin(), up.end(), [&](size_t a, size_t b) { return coord(a) < coord(b); });
    std::stable_sort(down.begin(), down.end(), [&](size_t a, size_t b) { return coord(a) > coord(b); });
  }
  const auto placed0 = placed;
  const auto leaders0 = leaders;
  const auto out0 = out;
  double best_total = INFINITY;
  std::vector<std::optional<ScatterLabel>> best_out = out;
  for (const auto& order : orders) {
    placed = placed0, leaders = leaders0, out = out0;
    double total = 0;
    for (size_t i : order) total += place_one(i);
    if (total < best_total) {
      best_total = total;
      best_out = out;
    }
  }
  out = best_out;
  std::vector<ScatterLabel> result;
  for (auto& l : out) result.push_back(*l);
  return result;
}

namespace {
struct Panel {
  double x0, y0, w, h;          // plot area in SVG units
  double xmin, xmax, ymin, ymax;
  double X(double x) const { return x0 + (xmax > xmin ? (x - xmin) / (xmax - xmin) : 0.5) * w; }
  double Y(double y) const { return y0 + h - (ymax > ymin ? (y - ymin) / (ymax - ymin) : 0.5) * h; }
};

void pad_range(double& lo, double& hi) {
  if (!(hi > lo)) {  // one value (every method at one FLOPs/token, say): 5% of it either side
    const double m = std::isfinite(lo) ? lo : 0.0, d = m != 0 ? 0.05 * std::fabs(m) : 0.5;
    lo = m - d;
    hi = m + d;
    return;
  }
  const double d = 0.05 * (hi - lo);
  lo -= d;
  hi += d;
}

// The frame, the grid and the ticks (nice_ticks) of a panel, its axis labels and its title.
std::string axes(const Panel& p, const std::string& xlabel, const std::string& ylabel, const std::string& title) {
  std::string s = "<g class=\"axes\">\n";
  const AxisTicks xt = nice_ticks(p.xmin, p.xmax), yt = nice_ticks(p.ymin, p.ymax);
  for (size_t k = 0; k < xt.values.size(); ++k) {
    const double x = p.X(xt.values[k]);
    s += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#eee\"/>"
                     "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{2:.1f}\" y2=\"{3:.1f}\" stroke=\"#444\"/>\n",
                     x, p.y0, p.y0 + p.h, p.y0 + p.h + 4);
    s += fmt::format("<text class=\"xtick\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n", x,
                     p.y0 + p.h + 15, xt.labels[k]);
  }
  for (size_t k = 0; k < yt.values.size(); ++k) {
    const double y = p.Y(yt.values[k]);
    s += fmt::format("<line x1=\"{1:.1f}\" x2=\"{2:.1f}\" y1=\"{0:.1f}\" y2=\"{0:.1f}\" stroke=\"#eee\"/>"
                     "<line x1=\"{3:.1f}\" x2=\"{1:.1f}\" y1=\"{0:.1f}\" y2=\"{0:.1f}\" stroke=\"#444\"/>\n",
                     y, p.x0, p.x0 + p.w, p.x0 - 4);
    s += fmt::format("<text class=\"ytick\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{}</text>\n",
                     p.x0 - 6, y + 3.5, yt.labels[k]);
  }
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#444\"/>\n", p.x0,
                   p.y0, p.w, p.h);
  s += fmt::format("<text class=\"xlabel\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.w / 2, p.y0 + p.h + 32, html_escape(xlabel));
  s += fmt::format(
      "<text class=\"ylabel\" x=\"{0:.1f}\" y=\"{1:.1f}\" font-size=\"12\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {0:.1f} {1:.1f})\">{2}</text>\n",
      p.x0 - 48, p.y0 + p.h / 2, html_escape(ylabel));
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                   p.x0 + p.w / 2, p.y0 - 8, html_escape(title));
  return s + "</g>\n";
}

// A marker of `shape` (about 2r across) at (cx, cy): a <circle> for the circle, a <path> for the
// others; `attrs` (with a leading space) go first, `inner` (a <title>, say) inside it.
std::string marker_svg(MarkerShape shape, double cx, double cy, double r, const std::string& attrs,
                       const std::string& inner = "") {
  const std::string tail = inner.empty() ? std::string("/>") : ">" + inner;
  if (shape == MarkerShape::Circle)
    return fmt::format("<circle{} cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"{}\"{}{}", attrs, cx, cy, r, tail,
                       inner.empty() ? "" : "</circle>");
  const double q = r / 4;  // the shapes below are drawn for r = 4
  std::string d;
  switch (shape) {
    case MarkerShape::Square:
      d = fmt::format("M{:.2f},{:.2f}h{:.2f}v{:.2f}h{:.2f}z", cx - 3.6 * q, cy - 3.6 * q, 7.2 * q, 7.2 * q, -7.2 * q);
      break;
    case MarkerShape::TriangleUp:
      d = fmt::format("M{:.2f},{:.2f}L{:.2f},{:.2f}L{:.2f},{:.2f}z", cx, cy - 5 * q, cx + 4.6 * q, cy + 3.4 * q, cx - 4.6 * q,
                      cy + 3.4 * q);
      break;
    case MarkerShape::TriangleDown:
      d = fmt::format("M{:.2f},{:.2f}L{:.2f},{:.2f}L{:.2f},{:.2f}z", cx, cy + 5 * q, cx + 4.6 * q, cy - 3.4 * q, cx - 4.6 * q,
                      cy - 3.4 * q);
      break;
    default:  // diamond
      d = fmt::format("M{:.2f},{:.2f}L{:.2f},{:.2f}L{:.2f},{:.2f}L{:.2f},{:.2f}z", cx, cy - 5 * q, cx + 4.6 * q, cy, cx,
                      cy + 5 * q, cx - 4.6 * q, cy);
  }
  return fmt::format("<path{} d=\"{}\"{}{}", attrs, d, tail, inner.empty() ? "" : "</path>");
}

std::string dash_attr(const SeriesStyle& s) {
  return *s.dash ? fmt::format(" stroke-dasharray=\"{}\"", s.dash) : std::string();
}

// One scatter point: a method's mean with its 95% interval (NaN ends: none).
struct Dot {
  std::string method;
  SeriesStyle style;
  double x, y, lo = NAN, hi = NAN;
  bool front = false;
};

// The y range of a scatter plot: the means and the intervals of ordinary width. An interval more
// than four times as wide as the median one (seeds that disagree wildly) would squeeze every other
// method into a strip: where it reaches past the means and the others, it is clipped at the frame
// instead, with an arrow there and a note under the plot.
std::pair<double, double> scatter_y_range(const std::vector<Dot>& dots) {
  std::vector<double> widths;
  for (const Dot& d : dots)
    if (std::isfinite(d.lo) && std::isfinite(d.hi)) widths.push_back(d.hi - d.lo);
  std::sort(widths.begin(), widths.end());
  const double median = widths.empty() ? 0.0
                        : widths.size() % 2 ? widths[widths.size() / 2]
                                            : (widths[widths.size() / 2 - 1] + widths[widths.size() / 2]) / 2;
  double lo = INFINITY, hi = -INFINITY;
  for (const Dot& d : dots) {
    lo = std::min(lo, d.y);
    hi = std::max(hi, d.y);
    if (std::isfinite(d.lo) && std::isfinite(d.hi) && d.hi - d.lo <= 4 * median) {
      lo = std::min(lo, d.lo);
      hi = std::max(hi, d.hi);
    }
  }
  return {lo, hi};
}

// val bpb (y) against x, error bars from the intervals (clipped at the frame past scatter_y_range),
// labels placed without overlaps (place_scatter_labels); with `pareto`, the points no other beats on
// both axes (lower y, higher x) ringed and joined.
std::string scatter(std::vector<Dot> dots, const std::string& xlabel, const std::string& ylabel, const std::string& title,
                    const std::string& cls, bool pareto) {
  Panel p{80, 40, 440, 300, INFINITY, -INFINITY, INFINITY, -INFINITY};
  for (const Dot& d : dots) {
    p.xmin = std::min(p.xmin, d.x);
    p.xmax = std::max(p.xmax, d.x);
  }
  std::tie(p.ymin, p.ymax) = scatter_y_range(dots);
  if (dots.empty()) p.xmin = p.xmax = p.ymin = p.ymax = 0;
  pad_range(p.xmin, p.xmax);
  pad_range(p.ymin, p.ymax);
  if (pareto)
    for (Dot& d : dots)
      d.front = std::none_of(dots.begin(), dots.end(), [&](const Dot& o) {
        return o.y <= d.y && o.x >= d.x && (o.y < d.y || o.x > d.x);
      });
  std::vector<std::string> notes;
  if (pareto) notes.push_back("ringed, dashed: the Pareto front (lower bpb, higher tokens/s)");
  // The error bars (clipped at the frame) and where the labels go: not on them.
  std::string bars_svg;
  std::vector<std::pair<double, double>> at, sizes;
  std::vector<LabelBox> bars;
  for (const Dot& d : dots) {
    const double cx = p.X(d.x), cy = p.Y(d.y);
    at.emplace_back(cx, cy);
    sizes.emplace_back(text_width(d.method, 10), 12);
    if (!std::isfinite(d.lo) || !std::isfinite(d.hi)) continue;
    const bool cut_hi = d.hi > p.ymax, cut_lo = d.lo < p.ymin;
    const double top = p.Y(std::min(d.hi, p.ymax)), bottom = p.Y(std::max(d.lo, p.ymin));
    bars.push_back({cx - 4, top, 8, bottom - top});
    std::string ends;
    // an end inside the frame gets its cap; one past it an arrowhead on the frame, pointing on
    for (const auto& [cut, y, dir] : {std::tuple{cut_hi, top, -1.0}, std::tuple{cut_lo, bottom, 1.0}})
      ends += cut ? fmt::format("<path class=\"clipped\" d=\"M{:.2f},{:.2f}L{:.2f},{:.2f}L{:.2f},{:.2f}z\" fill=\"{}\" stroke=\"none\"/>",
                                cx - 4, y - 7 * dir, cx + 4, y - 7 * dir, cx, y, d.style.colour)
                  : fmt::format("<line x1=\"{0:.2f}\" x2=\"{1:.2f}\" y1=\"{2:.2f}\" y2=\"{2:.2f}\"/>", cx - 4, cx + 4, y);
    bars_svg += fmt::format(
        "<g class=\"ci\" data-method=\"{0}\" stroke=\"{1}\" stroke-width=\"1.2\"><title>{0}: 95% interval [{2:.4f}, {3:.4f}]</title>"
        "<line x1=\"{4:.2f}\" x2=\"{4:.2f}\" y1=\"{5:.2f}\" y2=\"{6:.2f}\"/>{7}</g>\n",
        html_escape(d.method), d.style.colour, d.lo, d.hi, cx, bottom, top, ends);
    if (cut_hi || cut_lo)
      notes.push_back(fmt::format("{} {}: 95% interval [{:.4f}, {:.4f}] runs past the {} of the plot (its bar cut at the arrowhead)",
                                  cut_hi && cut_lo ? "↕" : cut_hi ? "▲" : "▼", d.method, d.lo, d.hi,
                                  cut_hi && cut_lo ? "top and the bottom" : cut_hi ? "top" : "bottom"));
  }
  const double svg_h = 400 + 13 * std::max(0.0, double(notes.size()) - 1);
  std::string svg = svg_open(560, svg_h, " class=\"" + cls + "\"");
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
  svg += bars_svg;
  const std::vector<ScatterLabel> labels = place_scatter_labels(at, sizes, {p.x0, p.y0, p.w, p.h}, 5, bars, {0, 0, 560, svg_h});
  for (size_t i = 0; i < dots.size(); ++i)
    if (labels[i].leader)
      svg += fmt::format("<line class=\"leader\" x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"#888\" "
                         "stroke-width=\"0.8\"/>\n",
                         at[i].first, at[i].second, labels[i].lx, labels[i].ly);
  for (size_t i = 0; i < dots.size(); ++i) {
    const Dot& d = dots[i];
    if (d.front)
      svg += fmt::format("<circle class=\"front\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"7.5\" fill=\"none\" stroke=\"#222\" "
                         "stroke-width=\"1.5\"/>\n",
                         at[i].first, at[i].second);
    svg += marker_svg(d.style.marker, at[i].first, at[i].second, 4,
                      fmt::format(" class=\"point\" data-method=\"{}\" fill=\"{}\"", html_escape(d.method), d.style.colour),
                      fmt::format("<title>{}: {:.4f}</title>", html_escape(d.method), d.y)) +
           "\n";
  }
  // Labels: a label left of its point ends at its box's right edge, one above or below is centred
  // on it, so a text wider than text_width's estimate grows away from its point.
  for (size_t i = 0; i < dots.size(); ++i) {
    const LabelBox& b = labels[i].box;
    const double px = at[i].first;
    const bool left = b.x + b.w <= px, right = b.x >= px;
    svg += fmt::format("<text class=\"label\" x=\"{:.2f}\" y=\"{:.2f}\" font-size=\"10\"{} fill=\"{}\" stroke=\"#fff\" "
                       "stroke-width=\"3\" paint-order=\"stroke\">{}</text>\n",
                       right ? b.x : left ? b.x + b.w : b.x + b.w / 2, b.y + b.h - 3,
                       right ? "" : left ? " text-anchor=\"end\"" : " text-anchor=\"middle\"", dots[i].style.colour,
                       html_escape(dots[i].method));
  }
  for (size_t k = 0; k < notes.size(); ++k)
    svg += fmt::format("<text class=\"note\" x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" fill=\"#444\">{}</text>\n", p.x0,
                       p.y0 + p.h + 48 + 13 * double(k), html_escape(notes[k]));
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
    const auto losses = smoothed_losses(r.value("loss_curve", std::vector<double>{}), kLossSmoothing);
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
  // The legend under the plot, as many columns as its longest name allows, each entry the method's
  // line (dash pattern) and marker.
  double name_w = 0;
  for (const auto& r : rows) name_w = std::max(name_w, text_width(r.method, 11));
  const double col_w = 30 + name_w + 12;
  const size_t cols = std::max<size_t>(1, size_t(std::floor(520 / col_w)));
  const double legend_rows = double((rows.size() + cols - 1) / cols);  // 14 units apart, from y = 390
  std::string loss_svg = svg_open(560, 400 + 14 * std::max(0.0, legend_rows - 1), " class=\"loss\"");
  loss_svg += axes(a, "cumulative training FLOPs", "training loss (nats/token)",
                   fmt::format("loss vs compute (first seed, EMA β = {})", kLossSmoothing));
  std::vector<Dot> by_flops, by_speed;
  std::string curve_marks, legend;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const SeriesStyle style = leaderboard_series_style(i);
    std::string pts;
    for (const auto& [f, l] : r.loss) pts += fmt::format("{:.2f},{:.2f} ", a.X(f), a.Y(l));
    if (!pts.empty()) pts.pop_back();
    loss_svg += fmt::format("<polyline class=\"loss\" data-method=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\"{} "
                            "points=\"{}\"/>\n",
                            html_escape(r.method), style.colour, dash_attr(style), pts);
    // Its marker at four places along the curve (drawn over all curves), shifted by a tenth of a
    // quarter from one method to the next so that the markers of curves lying on each other do not
    // coincide.
    if (r.loss.size() > 1)
      for (int k = 0; k < 4; ++k) {
        const double f = (double(k) + (double((i * 3) % 10) + 0.5) / 10) / 4;
        const auto& [x, l] = r.loss[size_t(std::lround(f * double(r.loss.size() - 1)))];
        curve_marks += marker_svg(style.marker, a.X(x), a.Y(l), 3,
                                  fmt::format(" class=\"curve-mark\" fill=\"{}\" stroke=\"#fff\" stroke-width=\"0.6\"",
                                              style.colour)) +
                       "\n";
      }
    const double lx = 30 + double(i % cols) * col_w, ly = a.y0 + a.h + 50 + double(i / cols) * 14;
    legend += fmt::format("<g class=\"legend\"><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
                          "stroke-width=\"1.6\"{}/>",
                          lx, lx + 24, ly - 4, ly - 4, style.colour, dash_attr(style)) +
              marker_svg(style.marker, lx + 12, ly - 4, 3.5, fmt::format(" fill=\"{}\"", style.colour)) +
              fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text></g>\n", lx + 30, ly, html_escape(r.method));
    if (!std::isfinite(r.bpb)) continue;
    by_flops.push_back({r.method, style, r.fpt, r.bpb, r.lo, r.hi});
    if (std::isfinite(r.tps)) by_speed.push_back({r.method, style, r.tps, r.bpb, r.lo, r.hi});
  }
  loss_svg += curve_marks + legend + "</svg>\n";
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

std::vector<double> smoothed_losses(const std::vector<double>& losses, double beta) {
  std::vector<double> out;
  out.reserve(losses.size());
  double m = 0, bias = 1;  // bias = β^n after n finite losses
  for (double x : losses) {
    if (!std::isfinite(x)) {
      out.push_back(std::nan(""));
      continue;
    }
    m = beta * m + (1 - beta) * x;
    bias *= beta;
    out.push_back(m / (1 - bias));
  }
  return out;
}

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
