// Universal Transformer with adaptive computation time (arXiv 1807.03819; tensor2tensor
// universal_transformer_util, `universal_transformer_act`), as the residual stream of `ut_act`.
// The ACT arithmetic is exposed for tests.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mixbench::act {

constexpr double kEps = 0.01;         // halting threshold 1 − ε
constexpr double kPonderCost = 0.01;  // τ of the ponder cost τ·mean(N + R)
constexpr double kHaltBiasInit = 1.0;

// The UT timing signal (tensor2tensor get_timing_signal_1d, timescales 1 … 10⁴): row i of the
// [length, channels] result is [sin(i·κ_j) …, cos(i·κ_j) …] (zero-padded for odd channels) for
// positions start … start + length − 1. Token coordinates use it over positions, the depth
// coordinate row `step` of it over max_steps.
at::Tensor timing_signal(int64_t start, int64_t length, int64_t channels, const at::TensorOptions& opts);
// The row of one position held on the device, pos (int64 [1]): timing_signal(pos, 1, channels) as
// [1, channels] in pos's device and dtype `dtype`, computed there (no host read of pos).
at::Tensor timing_signal_at(const at::Tensor& pos, int64_t channels, at::ScalarType dtype);

// The halting state of every position (all [B,T]): cumulative halting probability h, remainder R,
// update count N.
struct Halting {
  at::Tensor h, R, N;
};
// One ACT step from halting probabilities p [B,T]: still = [h < 1]; new_halted =
// [h + p·still > 1−ε]·still; still = [h + p·still ≤ 1−ε]·still (at the last step every position
// still running halts: the remainder is spent); h += p·still; R += new_halted·(1 − h);
// h += new_halted·R (exactly 1); N += still + new_halted. Returns the update weight
// u = p·still + new_halted·R. `st` is updated in place.
at::Tensor act_step(Halting& st, const at::Tensor& p, bool last);
// τ·mean(N + R).
at::Tensor ponder_cost(const Halting& st);

}  // namespace mixbench::act
