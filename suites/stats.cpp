#include "suites/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/errors.h"

namespace mixbench {

double mean(const std::vector<double>& x) {
  if (x.empty()) throw InputError("the mean of no values");
  return std::accumulate(x.begin(), x.end(), 0.0) / double(x.size());
}

double sample_sd(const std::vector<double>& x) {
  if (x.size() < 2) return NAN;
  const double m = mean(x);
  double ss = 0;
  for (double v : x) ss += (v - m) * (v - m);
  return std::sqrt(ss / double(x.size() - 1));
}

double t_quantile_975(int64_t df) {
  static const double kT[30] = {12.70620474, 4.30265273, 3.18244631, 2.77644511, 2.57058184, 2.44691185,
                                2.36462425,  2.30600414, 2.26215716, 2.22813885, 2.20098516, 2.17881283,
                                2.16036866,  2.14478669, 2.13144955, 2.11990530, 2.10981558, 2.10092204,
                                2.09302405,  2.08596345, 2.07961384, 2.07387307, 2.06865761, 2.06389856,
                                2.05953855,  2.05552944, 2.05183052, 2.04840714, 2.04522964, 2.04227246};
  if (df < 1) throw InputError(fmt::format("a t quantile needs at least 1 degree of freedom (got {})", df));
  return df <= 30 ? kT[df - 1] : 1.959963984540054;
}

std::optional<Interval> ci95(const std::vector<double>& x) {
  if (x.size() < 2) return std::nullopt;
  const double m = mean(x), h = t_quantile_975(int64_t(x.size()) - 1) * sample_sd(x) / std::sqrt(double(x.size()));
  return Interval{m - h, m + h};
}

PairedDifference paired_difference(const std::vector<double>& x, const std::vector<double>& base) {
  if (x.empty() || x.size() != base.size())
    throw InputError(fmt::format("a paired difference needs as many values as baseline values, at least one ({} and {})",
                                 x.size(), base.size()));
  PairedDifference d;
  for (size_t i = 0; i < x.size(); ++i) d.per_seed.push_back(x[i] - base[i]);
  d.mean = mean(d.per_seed);
  d.ci95 = ci95(d.per_seed);
  return d;
}

std::string RankRange::str() const { return shared() ? fmt::format("{}–{}", lo, hi) : std::to_string(lo); }

std::vector<RankRange> shared_ranks(const std::vector<double>& means, const std::vector<std::optional<Interval>>& ci) {
  if (means.size() != ci.size())
    throw InputError(fmt::format("ranks need one interval per mean ({} means, {} intervals)", means.size(), ci.size()));
  const size_t n = means.size();
  const size_t with = size_t(std::count_if(ci.begin(), ci.end(), [](const auto& c) { return c.has_value(); }));
  std::vector<RankRange> r(n);
  if (with == 0) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return means[a] < means[b]; });
    for (size_t k = 0; k < n; ++k) r[order[k]] = {int64_t(k + 1), int64_t(k + 1)};
    return r;
  }
  // an entry without an interval: one of unknown extent
  auto lo = [&](size_t i) { return ci[i] ? ci[i]->lo : -INFINITY; };
  auto hi = [&](size_t i) { return ci[i] ? ci[i]->hi : INFINITY; };
  for (size_t i = 0; i < n; ++i) {
    int64_t below = 0, not_above = 0;
    for (size_t j = 0; j < n; ++j) {
      below += j != i && hi(j) < lo(i);
      not_above += !(lo(j) > hi(i));
    }
    r[i] = {1 + below, not_above};
  }
  return r;
}

}  // namespace mixbench
