#include "mixers/loop/loop_ref.h"

#include <ATen/ATen.h>

#include <vector>

#include "harness/backbone.h"

namespace mixbench::loop_ref {

at::Tensor rms_norm(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t) {
      rows.push_back(x[i][t] / at::sqrt(at::dot(x[i][t], x[i][t]) / double(d) + kRmsEps));
    }
  return at::stack(rows).view(x.sizes());
}

}  // namespace mixbench::loop_ref
