// Agreement between two rankings of the same items: Kendall's τ-b.
#pragma once
#include <vector>

namespace mixbench {

// Kendall's τ-b of paired scores (a[i], b[i]) of the same n items (ranks, or values a ranking sorts
// by): (C − D) / √((P − Ta)(P − Tb)) over the P = n(n−1)/2 pairs, C concordant, D discordant, Ta / Tb
// the pairs tied in a / b. 1 = the same order, −1 = the reverse; NaN where it is undefined (fewer
// than two items, or every item tied in a or in b). UsageError when the lengths differ.
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace mixbench
