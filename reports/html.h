// Pieces shared by the offline HTML pages (reports/plot.cpp, reports/leaderboard.cpp): text
// escaping, the series colours and the opening <svg> tag.
#pragma once
#include <cstddef>
#include <string>

namespace mixbench {

// Escapes &, <, > and " for HTML text and attribute values.
std::string html_escape(const std::string& s);

// The series colours: the ten of matplotlib's tab10, in the order each page assigns them to its
// series (the i-th method of a page gets series_colour(i % 10, ...)).
enum class SeriesOrder {
  Sweep,        // blue, red, green, purple, orange, brown, pink, cyan, olive, grey
  Leaderboard,  // blue, red, green, orange, purple, brown, pink, grey, olive, cyan
};
const char* series_colour(size_t i, SeriesOrder order);

// `<svg xmlns=... width=W height=H viewBox="0 0 W H" font-family="sans-serif"EXTRA>` and a newline;
// `extra_attributes` starts with a space when given.
std::string svg_open(double width, double height, const std::string& extra_attributes = "");

}  // namespace mixbench
