#include "reports/html.h"

#include <fmt/format.h>

namespace mixbench {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

const char* series_colour(size_t i, SeriesOrder order) {
  // tab10: blue, orange, green, red, purple, brown, pink, grey, olive, cyan
  static const char* const kTab10[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  static const int kSweep[] = {0, 3, 2, 4, 1, 5, 6, 9, 8, 7};
  static const int kLeaderboard[] = {0, 3, 2, 1, 4, 5, 6, 7, 8, 9};
  return kTab10[(order == SeriesOrder::Sweep ? kSweep : kLeaderboard)[i % 10]];
}

std::string svg_open(double width, double height, const std::string& extra_attributes) {
  return fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}" font-family="sans-serif"{}>)",
                     width, height, width, height, extra_attributes) +
         "\n";
}

}  // namespace mixbench
