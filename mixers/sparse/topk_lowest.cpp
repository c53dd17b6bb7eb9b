// topk_lowest_index: the first k columns of a stable descending sort, through at::topk. Each fp32
// score and its column are packed into one int64 key whose order is (score ascending, column
// descending):
//   key = ord(score) · 2³² + (2³² − 1 − column),
// ord = the score's bits as int32, the 31 magnitude bits flipped for negative scores (so that the
// integer order is the float order; −0.0 is first made +0.0, which it equals). All keys of a row
// differ, so the k largest keys are one set in one order whatever top-k algorithm picks them:
// descending score, ties to the lower column — with no sort of the whole row and no host
// synchronisation (at::topk runs on the device where the scores are).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "harness/errors.h"
#include "mixers/sparse/sparse.h"

namespace mixbench {

at::Tensor topk_lowest_index(const at::Tensor& scores, int64_t k) {
  c10::NoGradGuard ng;
  if (scores.scalar_type() != at::kFloat)
    throw InputError(fmt::format("topk_lowest_index: scores must be fp32, got {}", c10::toString(scores.scalar_type())));
  const int64_t n = scores.size(-1);
  if (n >= (int64_t(1) << 32)) throw InputError(fmt::format("topk_lowest_index: {} columns (at most 2^32 − 1)", n));
  if (k < 0 || k > n) throw InputError(fmt::format("topk_lowest_index: k = {} of {} columns", k, n));
  constexpr int64_t kLow = (int64_t(1) << 32) - 1;
  const at::Tensor s = scores.detach().masked_fill(scores.detach() == 0, 0.0).contiguous();  // −0.0 → +0.0
  const at::Tensor bits = s.view(at::kInt);
  const at::Tensor ord = at::where(bits < 0, bits.bitwise_xor(0x7FFFFFFF), bits).to(at::kLong);
  const at::Tensor col = at::arange(n, s.options().dtype(at::kLong));
  const at::Tensor key = ord * (int64_t(1) << 32) + (kLow - col);
  const at::Tensor top = std::get<0>(at::topk(key, k, -1, /*largest=*/true, /*sorted=*/true));
  return kLow - top.bitwise_and(kLow);
}

}  // namespace mixbench
