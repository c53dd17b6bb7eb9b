// Small building blocks shared by the optimized layers of every family (not by the references).
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>

namespace mixbench::layers {

// Half-precision (bf16/fp16) tensors are computed in fp32: the recurrent state and every
// accumulation stay in fp32, as fused kernels keep them; outputs go back to the input dtype and
// final states stay fp32 (as flash-linear-attention returns them).
bool is_half(const at::Tensor& t);
at::Tensor f32(const at::Tensor& t);  // undefined stays undefined

// RMSNorm over the last dim without weight; eps = float32 epsilon (nanochat's F.rms_norm default).
// Half-precision inputs are normalised in fp32 and rounded once (RoPE likewise).
at::Tensor rms_norm(const at::Tensor& x);
// Rotary embedding on [B,T,H,D], half-split layout with nanochat's sign convention
// (y1 = x1 cos + x2 sin, y2 = −x1 sin + x2 cos), angles t·base^(−2i/D) computed in FP64 and cast
// to x's dtype. `offset` is the position of the first token (decode).
at::Tensor rope(const at::Tensor& x, double base, int64_t offset = 0);
// Per-position logit scale s_t = log_a(t + a) (HypeNet), shape [T], FP64.
at::Tensor logit_scale(int64_t T, double a, int64_t offset = 0);
// Average number of visible keys per query for causal attention over T tokens with a window of
// w keys including self (0 = unlimited): (1/T)·Σ_t min(t+1, w).
double mean_visible(int64_t T, int64_t w);

}  // namespace mixbench::layers
