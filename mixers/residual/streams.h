// The residual streams of residual_standard, hc and mhc (methods.md §5, method-details.md
// "Residual streams"), and the Sinkhorn–Knopp projection mhc uses.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "harness/residual.h"

namespace mixbench::residual {

// h ← h + F(norm(h)) around every sublayer; no parameters.
std::shared_ptr<const ResidualStream> standard_stream();
// Dynamic Hyper-Connections with n streams (n ≥ 1).
std::shared_ptr<const ResidualStream> hc_stream(int64_t n);
// mHC with n streams and `sinkhorn_iters` Sinkhorn–Knopp iterations (both ≥ 1).
std::shared_ptr<const ResidualStream> mhc_stream(int64_t n, int64_t sinkhorn_iters);

// Sinkhorn–Knopp on exp(logits) [..., n, n] in the log domain: `iters` times, columns normalised
// to sum 1 and then rows, so rows sum to 1 exactly and columns up to the iteration's convergence.
// Computed in at least FP32 (FP32 for half-precision logits); returns the matrix, not its log.
at::Tensor sinkhorn(const at::Tensor& logits, int64_t iters);
// The same with explicit loops over the n² entries and the iterations (the FP64 reference).
at::Tensor sinkhorn_reference(const at::Tensor& logits, int64_t iters);

}  // namespace mixbench::residual
