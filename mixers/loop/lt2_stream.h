// LT2's cross-loop residual (seed 004 §2.1): the whole stack of `blocks` blocks runs `loops`
// times, and at the end of loop τ ≥ 2 the state becomes h⁽τ⁾ = h̃⁽τ⁾ + ρ_τ ⊙ h⁽τ⁻¹⁾, where h̃⁽τ⁾ is
// the stack's output in loop τ (nanochat's residual update inside it) and h⁽τ⁻¹⁾ the state the
// loop started from. ρ ("lt2_rho", [loops − 1, d], one per-channel vector per loop boundary) is
// zero-initialised, so a fresh model is the looped stack without the cross-loop term, and one loop
// has no ρ at all (the plain stack). Everything else is nanochat's stream (resid_lambdas /
// x0_lambdas per plan step, the backout at the unrolled midpoint).
#pragma once
#include <cstdint>
#include <memory>

#include "harness/residual.h"

namespace mixbench {

// The stream of a plan that runs blocks 0 … blocks−1 in order, `loops` times (InputError for
// blocks < 1 or loops < 1).
std::shared_ptr<const ResidualStream> lt2_stream(int64_t blocks, int64_t loops);

}  // namespace mixbench
