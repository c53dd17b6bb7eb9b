// Ouro, looped language model (arXiv 2510.25741; ByteDance/Ouro modeling_ouro.py), as the plan
// and residual stream of `ouro`. The exit arithmetic is exposed for tests; each function has an
// FP64 reference twin written position by position (the `ref_` ones).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "harness/plan.h"

namespace mixbench::ouro {

constexpr double kEntropyBeta = 0.1;     // β of the stage-1 loss Σ p(t)·CE_t − β·H(p) (seed 001)
constexpr double kExitThreshold = 0.5;   // evaluation exits where the cumulative exit probability reaches it
constexpr double kTargetSlope = 50.0;    // k of the stage-2 target w = σ(k·(I − γ)) (the paper's)
constexpr double kTargetMargin = 0.005;  // γ
// The gate-only stage's share of a run: 1,024 of the original's 46,875 updates (seed 001).
constexpr double kGateStageFrac = 1024.0 / 46875.0;

// The exit distribution from the gates' exit probabilities λ [..., K]:
// p(k) = λ_k·Π_{j<k}(1 − λ_j) for k < K−1 and p(K−1) = Π_{j<K−1}(1 − λ_j) (the last exit takes the
// remaining mass, its own gate unused), so Σ_k p(k) = 1.
at::Tensor exit_distribution(const at::Tensor& gates);
// The exit each position takes outside training: the first k whose cumulative exit probability
// Σ_{j≤k} p(j) reaches `threshold`, the last exit when none does. p [B,T,K] → [B,T] int64.
at::Tensor exit_choice(const at::Tensor& probs, double threshold = kExitThreshold);

// Stage 1 (all parameters): Σ_k p(k)·CE_k averaged over the counted positions (`lm`) and
// −β·H(p) averaged likewise (`aux`); ce [K,B,T], p [B,T,K], valid [B,T] bool.
struct Stage1 {
  at::Tensor lm, aux;
};
Stage1 stage1_loss(const at::Tensor& ce, const at::Tensor& probs, const at::Tensor& valid);
// Stage 2 (the gate alone): gate k < K−1 learns from the detached improvement of the next loop,
// I = max(0, CE_k − CE_{k+1}), its continuation target w = σ(k_s·(I − γ)), by the binary
// cross-entropy −[w·log(1 − λ_k) + (1 − w)·log λ_k], averaged over the counted positions and the
// K−1 gates that have a next loop (zero, with a gradient path, for K = 1).
at::Tensor stage2_loss(const at::Tensor& ce, const at::Tensor& gates, const at::Tensor& valid);

// The reference twins (explicit loops over positions and exits).
at::Tensor ref_exit_distribution(const at::Tensor& gates);
at::Tensor ref_exit_choice(const at::Tensor& probs, double threshold = kExitThreshold);
Stage1 ref_stage1_loss(const at::Tensor& ce, const at::Tensor& probs, const at::Tensor& valid);
at::Tensor ref_stage2_loss(const at::Tensor& ce, const at::Tensor& gates, const at::Tensor& valid);

// The layout of an ouro model: `prelude` blocks once, then `loops` times the core blocks followed
// by the coda blocks (every loop is read out). Plan steps in that order, one cache slot each.
struct Layout {
  int64_t prelude = 1, core = 1, coda = 1, loops = 1;
  int64_t per_loop() const { return core + coda; }
  int64_t n_steps() const { return prelude + loops * per_loop(); }
  bool in_loop(int64_t step) const { return step >= prelude; }
  int64_t loop_of(int64_t step) const { return (step - prelude) / per_loop(); }
  // whether plan step `step` is the last core step / the last coda step of its loop
  bool closes_core(int64_t step) const { return in_loop(step) && (step - prelude) % per_loop() == core - 1; }
  bool closes_coda(int64_t step) const { return in_loop(step) && (step - prelude) % per_loop() == per_loop() - 1; }
};
ExecPlan plan(const Layout& l);

}  // namespace mixbench::ouro
