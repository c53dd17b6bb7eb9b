// DeepLoop (seed 001, DeepLoop v2): nanochat's SSSL `dense` stack run twice (n_loops = 2, no
// prelude or coda), every attention and MLP sublayer post-normalised,
//   x ← RMSNorm(α·x + F(RMSNorm(x))),  α = √(2N),
// with the Xavier init gain β = 1/√(8N) on V, O and both MLP matrices (Q/K keep nanochat's init)
// and the value-embedding tables' init range scaled by β. N counts unrolled layers (plan steps,
// each an attention and an MLP sublayer: the 2 and 8 of DeepNet's rule count the sublayers of a
// layer). nanochat's resid/x0 mixing is off; its backout (λ times the state after the unrolled
// midpoint, subtracted before the final norm) stays.
#pragma once
#include <memory>

#include "harness/residual.h"

namespace mixbench {

double deeploop_alpha(int64_t n_unrolled);  // √(2N)
double deeploop_beta(int64_t n_unrolled);   // 1/√(8N)

// The stream. Its fast path scales the residual by `alpha` (0: √(2N) of the pass's plan); its
// FP64 reference (Backend::Reference) always derives α = √(2N) from the plan depth on its own, so a
// fast path with another α fails conformance.
std::shared_ptr<const ResidualStream> deeploop_stream(double alpha = 0);

}  // namespace mixbench
