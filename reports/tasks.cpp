#include "reports/tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "reports/html.h"

namespace mixbench {

using Json = nlohmann::json;

namespace {

// Held-out accuracy per (method, setting label), averaged over the seeds that ran.
struct Cell {
  double sum = 0;
  int n = 0;
  std::string status;  // of the first row (shown when no seed ran)
  std::string why;
};
struct Grid {
  std::vector<std::string> methods, labels;  // in order of appearance
  std::map<std::string, Json> setting;       // label -> setting
  std::map<std::string, double> chance;      // label -> chance
  std::map<std::pair<std::string, std::string>, Cell> cells;
  double acc(const std::string& m, const std::string& l) const {
    auto it = cells.find({m, l});
    return it == cells.end() || it->second.n == 0 ? NAN : it->second.sum / it->second.n;
  }
  std::vector<std::string> labels_of(const std::string& task) const {
    std::vector<std::string> v;
    for (const auto& l : labels)
      if (setting.at(l)["task"] == task) v.push_back(l);
    return v;
  }
  std::vector<std::string> tasks() const {
    std::vector<std::string> v;
    for (const auto& l : labels) {
      const std::string t = setting.at(l)["task"].get<std::string>();
      if (std::find(v.begin(), v.end(), t) == v.end()) v.push_back(t);
    }
    return v;
  }
};

Grid grid_of(const Json& results) {
  Grid g;
  for (const auto& r : results) {
    const std::string m = r.value("method", std::string("?")), l = r.value("label", std::string("?"));
    if (std::find(g.methods.begin(), g.methods.end(), m) == g.methods.end()) g.methods.push_back(m);
    if (!g.setting.count(l)) {
      g.labels.push_back(l);
      g.setting[l] = r.value("setting", Json::object());
      g.chance[l] = r.value("chance", 0.0);
    }
    Cell& c = g.cells[{m, l}];
    if (c.status.empty()) {
      c.status = r.value("status", std::string("?"));
      c.why = r.value("reason", r.value("message", std::string()));
    }
    if (r.value("status", std::string()) == "ok") {
      c.sum += r["accuracy"].get<double>();
      ++c.n;
    }
  }
  return g;
}

// The part of a label after the task name ("pairs=4 len=64 d=64").
std::string short_label(const std::string& label, const std::string& task) {
  return label.size() > task.size() + 1 ? label.substr(task.size() + 1) : label;
}

// ------------------------------------------------------------------ small-multiple line plots
struct Line {
  std::string name;
  const char* colour;
  std::map<int64_t, double> pts;  // x -> accuracy
};

// One panel: categorical x (the distinct x values, evenly spaced: the grids double), accuracy in
// [0, 1] on y, chance as a dashed grey line.
std::string line_panel(const std::string& title, const std::string& xlabel, const std::vector<Line>& lines,
                       double chance) {
  std::set<int64_t> xs;
  for (const auto& l : lines)
    for (const auto& [x, y] : l.pts) xs.insert(x);
  const double W = 280, H = 210, x0 = 46, y0 = 26, w = 214, h = 140;
  std::vector<int64_t> xv(xs.begin(), xs.end());
  auto X = [&](int64_t x) {
    const auto i = double(std::find(xv.begin(), xv.end(), x) - xv.begin());
    return xv.size() < 2 ? x0 + w / 2 : x0 + 10 + i * (w - 20) / double(xv.size() - 1);
  };
  auto Y = [&](double a) { return y0 + h - a * h; };
  std::string s = svg_open(W, H, " class=\"panel\"");
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", x0, y0, w, h);
  for (double a : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", x0, x0 + w, Y(a), Y(a));
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:g}</text>\n", x0 - 4, Y(a) + 3, a);
  }
  for (int64_t x : xv)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{}</text>\n", X(x), y0 + h + 13, x);
  s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\" stroke-dasharray=\"4,3\"/>\n", x0,
                   x0 + w, Y(chance), Y(chance));
  for (const auto& l : lines) {
    std::string path;
    for (const auto& [x, a] : l.pts) {
      if (std::isnan(a)) continue;
      path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", X(x), Y(a));
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"><title>{}: {:.3f}</title></circle>\n", X(x),
                       Y(a), l.colour, html_escape(l.name), a);
    }
    if (!path.empty())
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n", path, l.colour);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n", x0 + w / 2, y0 + h + 30,
                   html_escape(xlabel));
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                   x0 + w / 2, y0 - 9, html_escape(title));
  s += fmt::format(
      "<text x=\"12\" y=\"{0}\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 {0})\">accuracy</text>\n",
      y0 + h / 2);
  return s + "</svg>\n";
}

// Lines of accuracy against setting field `xkey` over `labels`, one line per method.
std::vector<Line> lines_over(const Grid& g, const std::vector<std::string>& labels, const std::string& xkey) {
  std::vector<Line> lines;
  for (size_t i = 0; i < g.methods.size(); ++i) {
    Line l{g.methods[i], series_colour(i, SeriesOrder::Leaderboard), {}};
    for (const auto& lab : labels) {
      const double a = g.acc(g.methods[i], lab);
      if (!std::isnan(a)) l.pts[g.setting.at(lab)[xkey].get<int64_t>()] = a;
    }
    lines.push_back(l);
  }
  return lines;
}

int64_t field(const Grid& g, const std::string& label, const std::string& key) {
  return g.setting.at(label).value(key, int64_t(0));
}

// Background of a heat-table cell: red at chance or below, through yellow, to green at 1.
std::string heat_colour(double acc, double chance) {
  const double t = std::clamp((acc - chance) / std::max(1e-9, 1.0 - chance), 0.0, 1.0);
  return fmt::format("hsl({:.0f},70%,{:.0f}%)", 120 * t, 78 - 8 * t);
}

std::string cell_text(const Grid& g, const std::string& m, const std::string& l) {
  auto it = g.cells.find({m, l});
  if (it == g.cells.end()) return "";
  if (it->second.n == 0) return it->second.status;
  return fmt::format("{:.3f}", it->second.sum / it->second.n);
}
}  // namespace

std::string tasks_markdown(const Json& results) {
  const Grid g = grid_of(results);
  std::string md;
  for (const auto& task : g.tasks()) {
    const auto labels = g.labels_of(task);
    md += fmt::format("\n### {}\n\n| method |", task);
    std::string rule = "|---|";
    for (const auto& l : labels) {
      md += fmt::format(" {} (chance {:.3f}) |", short_label(l, task), g.chance.at(l));
      rule += "---:|";
    }
    md += "\n" + rule + "\n";
    for (const auto& m : g.methods) {
      md += "| " + m + " |";
      for (const auto& l : labels) {
        const std::string t = cell_text(g, m, l);
        md += " " + (t.empty() ? "-" : t) + " |";
      }
      md += "\n";
    }
  }
  std::string notes;
  for (const auto& [key, c] : g.cells)
    if (c.n == 0 && !c.why.empty()) notes += fmt::format("- {} on {}: {}: {}\n", key.first, key.second, c.status, c.why);
  if (!notes.empty()) md += "\nNot run:\n\n" + notes;
  return md;
}

std::string tasks_html(const Json& results, const std::string& title) {
  const Grid g = grid_of(results);
  std::string h = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html_escape(title) + "</title>\n";
  h += "<style>body{font-family:sans-serif;margin:20px;max-width:1360px} .panels{display:flex;flex-wrap:wrap;gap:6px}"
       " table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
       " th{background:#f4f4f4;text-align:center} td.m{text-align:left;vertical-align:top} th.v{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left} .legend span{margin-right:14px}"
       " .note{color:#555;font-size:13px}</style></head><body>\n";
  h += "<h1>" + html_escape(title) + "</h1>\n";
  h += "<p class=\"note\">Held-out accuracy on the answer tokens (greedy argmax), mean over seeds; dashed: chance.</p>\n";
  h += "<div class=\"legend\">";
  for (size_t i = 0; i < g.methods.size(); ++i)
    h += fmt::format("<span><svg width=\"22\" height=\"10\"><line x1=\"0\" x2=\"22\" y1=\"5\" y2=\"5\" stroke=\"{}\" "
                     "stroke-width=\"3\"/></svg> {}</span>",
                     series_colour(i, SeriesOrder::Leaderboard), html_escape(g.methods[i]));
  h += "</div>\n";
  // MQAR as Zoology's figure 2: per sequence length, accuracy against the pairs (at the widest
  // model) and against the width (at the most pairs)
  const auto mqar = g.labels_of("mqar");
  if (!mqar.empty()) {
    std::set<int64_t> lengths;
    for (const auto& l : mqar) lengths.insert(field(g, l, "length"));
    h += "<h2>MQAR</h2>\n<div class=\"panels\">\n";
    for (int64_t L : lengths) {
      int64_t dmax = 0, pmax = 0;
      for (const auto& l : mqar)
        if (field(g, l, "length") == L) {
          dmax = std::max(dmax, field(g, l, "d_model"));
          pmax = std::max(pmax, field(g, l, "pairs"));
        }
      std::vector<std::string> by_pairs, by_width;
      for (const auto& l : mqar) {
        if (field(g, l, "length") != L) continue;
        if (field(g, l, "d_model") == dmax) by_pairs.push_back(l);
        if (field(g, l, "pairs") == pmax) by_width.push_back(l);
      }
      const double chance = g.chance.at(mqar[0]);
      h += line_panel(fmt::format("len {}, d {}", L, dmax), "key-value pairs", lines_over(g, by_pairs, "pairs"), chance);
      h += line_panel(fmt::format("len {}, {} pairs", L, pmax), "model width", lines_over(g, by_width, "d_model"), chance);
    }
    h += "</div>\n";
  }
  // length generalisation: accuracy against the held-out length, for the settings held out at
  // other lengths than their training length (one panel per trained setting)
  std::string lg;
  for (const auto& task : g.tasks()) {
    std::vector<std::string> trained;  // labels of the held-out length = training length
    for (const auto& l : g.labels_of(task))
      if (field(g, l, "test_length") == field(g, l, "length")) trained.push_back(l);
    for (const auto& base : trained) {
      std::vector<std::string> same;  // the setting at every held-out length
      for (const auto& l : g.labels_of(task)) {
        Json a = g.setting.at(l), b = g.setting.at(base);
        a.erase("test_length");
        b.erase("test_length");
        if (a == b) same.push_back(l);
      }
      if (same.size() < 2) continue;
      lg += line_panel(fmt::format("{} (trained at {}, d {})", task, field(g, base, "length"), field(g, base, "d_model")),
                       "held-out length", lines_over(g, same, "test_length"), g.chance.at(base));
    }
  }
  if (!lg.empty()) h += "<h2>Length generalisation</h2>\n<div class=\"panels\">\n" + lg + "</div>\n";
  // the heat table: a row per setting, a column per method
  h += "<h2>Every setting</h2>\n<table>\n<tr><th>task</th><th>setting</th><th>chance</th>";
  for (const auto& m : g.methods) h += "<th class=\"v\">" + html_escape(m) + "</th>";
  h += "</tr>\n";
  for (const auto& task : g.tasks()) {
    const auto labels = g.labels_of(task);
    for (size_t i = 0; i < labels.size(); ++i) {
      const std::string& l = labels[i];
      h += "<tr>";
      if (i == 0) h += fmt::format("<td class=\"m\" rowspan=\"{}\">{}</td>", labels.size(), html_escape(task));
      h += fmt::format("<td class=\"m\">{}</td><td>{:.3f}</td>", html_escape(short_label(l, task)), g.chance.at(l));
      for (const auto& m : g.methods) {
        const double a = g.acc(m, l);
        const auto it = g.cells.find({m, l});
        const std::string why = it == g.cells.end() ? "" : it->second.why;
        h += std::isnan(a) ? fmt::format("<td style=\"color:#888\" title=\"{}\">{}</td>", html_escape(why),
                                         html_escape(cell_text(g, m, l)))
                           : fmt::format("<td style=\"background:{}\">{:.3f}</td>", heat_colour(a, g.chance.at(l)), a);
      }
      h += "</tr>\n";
    }
  }
  h += "</table>\n</body></html>\n";
  return h;
}

}  // namespace mixbench
