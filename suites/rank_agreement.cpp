#include "suites/rank_agreement.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "harness/errors.h"

namespace mixbench {

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size())
    throw UsageError(fmt::format("kendall_tau: rankings of {} and {} items", a.size(), b.size()));
  const size_t n = a.size();
  int64_t concordant = 0, discordant = 0, tied_a = 0, tied_b = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      if (da == 0) ++tied_a;
      if (db == 0) ++tied_b;
      if (da == 0 || db == 0) continue;
      ((da > 0) == (db > 0) ? concordant : discordant) += 1;
    }
  const double pairs = double(n) * double(n > 0 ? n - 1 : 0) / 2.0;
  const double denom = std::sqrt((pairs - double(tied_a)) * (pairs - double(tied_b)));
  if (!(denom > 0)) return std::nan("");
  return double(concordant - discordant) / denom;
}

}  // namespace mixbench
