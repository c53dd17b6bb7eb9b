// Huginn, recurrent depth (arXiv 2502.05171; seal-rg/recurrent-pretraining raven_modeling_minimal.py),
// as the residual stream of `huginn`. The depth sampler and the initial state are exposed for tests.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace mixbench::huginn {

constexpr double kDepthSigma = 0.5;  // σ of the log-normal rate

// Core applications at a training step: τ ~ N(ln r̄ − σ²/2, σ), r = Poisson(e^τ) + 1, at most
// max_loops; drawn from a generator seeded by (seed, step) only, so every run is reproducible.
int64_t sample_depth(uint64_t seed, int64_t step, double mean_loops, int64_t max_loops);
// The probability that a sampled depth runs core application k (0-based): P(r > k) =
// E_τ[P(Poisson(e^τ) ≥ k)], integrated numerically over τ; the accountant bills application k by it.
double run_probability(int64_t k, double mean_loops);
// The depth outside training (evaluation, decoding, conformance): r̄ rounded, within [1, max_loops].
int64_t eval_depth(double mean_loops, int64_t max_loops);

// The initial state s₀ [B,T,d] for positions pos … pos + T − 1 of global rows row0 … row0 + B − 1:
// TruncNormal(0, σ²), σ = √(2/(5d)), cut at ±3σ (inverse-CDF sampling, as torch trunc_normal_),
// each row from a generator seeded by (seed, global row) drawing positions 0 … pos + T − 1 in order.
at::Tensor initial_state(uint64_t seed, int64_t row0, int64_t B, int64_t pos, int64_t T, int64_t d,
                         const at::TensorOptions& opts);

}  // namespace mixbench::huginn
