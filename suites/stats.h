// Statistics of the leaderboard's repeated runs: mean, sample standard deviation, Student-t 95%
// intervals, differences paired by seed, and ranks shared where intervals overlap. Pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mixbench {

struct Interval {
  double lo = 0, hi = 0;
};

double mean(const std::vector<double>& x);       // InputError when empty
double sample_sd(const std::vector<double>& x);  // n − 1 in the denominator; NaN for fewer than 2 values

// The 0.975 quantile of Student's t with `df` degrees of freedom (a table for df 1..30, the normal
// quantile 1.959964 beyond); InputError for df < 1.
double t_quantile_975(int64_t df);

// Two-sided 95% t-interval of the mean: mean ± t(n−1)·sd/√n; none for fewer than 2 values.
std::optional<Interval> ci95(const std::vector<double>& x);

// x[i] − base[i] per seed, their mean and its 95% interval (none for one seed). InputError when the
// lengths differ or are 0.
struct PairedDifference {
  std::vector<double> per_seed;
  double mean = 0;
  std::optional<Interval> ci95;
};
PairedDifference paired_difference(const std::vector<double>& x, const std::vector<double>& base);

// A rank or a range of ranks shared with the entries whose intervals overlap ("2", "3–5").
struct RankRange {
  int64_t lo = 0, hi = 0;
  bool shared() const { return hi > lo; }
  std::string str() const;
};
// Lower is better. With intervals for every entry: lo = 1 + #entries whose interval lies strictly
// below this one's (their hi < this lo), hi = #entries whose interval does not lie strictly above
// it (their lo ≤ this hi, itself included); an entry without an interval (a single run among
// entries with several) counts as one of unknown extent, (−∞, +∞): it shares every rank, and every
// other range includes it. Without any interval (single runs only): the distinct ranks of the means
// in order, equal means in input order. InputError when the lengths differ.
std::vector<RankRange> shared_ranks(const std::vector<double>& means, const std::vector<std::optional<Interval>>& ci);

}  // namespace mixbench
