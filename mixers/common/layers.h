// Small building blocks shared by the optimized layers of every family (not by the references).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/registry.h"

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
// The same rotation at given positions: `positions` [B,T] (int64) holds each token's position.
at::Tensor rope_at(const at::Tensor& x, double base, const at::Tensor& positions);
// rope for decoded tokens x [B,1,H,D] at the position held on the device (int64 [1], a static decode
// cache's pos_dev): the values of rope(x, base, pos) without reading pos on the host, so that a
// captured CUDA graph replays it at any position.
at::Tensor rope_pos_dev(const at::Tensor& x, double base, const at::Tensor& pos_dev);
// A constant computed on the host by `make` and moved to `opts`. On a GPU it is made once per key,
// device and dtype and kept, so that a training step replayed from a CUDA graph copies nothing from
// the host (a capture refuses host-to-device copies from pageable memory). On the CPU: make().to(opts).
at::Tensor device_constant(const std::string& key, const at::TensorOptions& opts, const std::function<at::Tensor()>& make);
// Per-position logit scale s_t = log_a(t + a) (HypeNet), shape [T], FP64.
at::Tensor logit_scale(int64_t T, double a, int64_t offset = 0);
// Average number of visible keys per query for causal attention over T tokens with a window of
// w keys including self (0 = unlimited): (1/T)·Σ_t min(t+1, w).
double mean_visible(int64_t T, int64_t w);

// A layer's value-embedding pieces; which layers take one is the backbone's rule (layer_has_ve,
// harness/backbone.h). `heads` value heads of `head_v` channels each.
// ve width Hv·V on value-embedding layers, else 0 (MethodSpec::ve_dim).
int64_t ve_width(const LayerCtx& ctx, int64_t heads, int64_t head_v);
// Appends "ve_gate" [heads, kVeGateChannels] (nanochat init U(0, 0.02)) on value-embedding layers.
void add_ve_gate_param(std::vector<ParamDef>& p, const LayerCtx& ctx, int64_t heads);
// The gate's matmul parameters: kVeGateChannels·heads on value-embedding layers, else 0.
int64_t ve_gate_params(const LayerCtx& ctx, int64_t heads);
// v [B,T,heads,V] + 3·sigmoid(x[..., :kVeGateChannels] W_vegᵀ)·ve when `in` holds "ve" (with "x"
// and "ve_gate"); v unchanged otherwise.
at::Tensor add_value_embed(const at::Tensor& v, const TensorMap& in);
// Conformance inputs of a layer: "x" [B,T,d] and, on value-embedding layers, "ve" [B,T,heads·V],
// both N(0,1) FP64 drawn in that order.
TensorMap layer_inputs(const LayerCtx& ctx, int64_t B, int64_t T, int64_t d, int64_t heads, int64_t head_v,
                       at::Generator& gen);
// Config rule of every layer with a value-embedding gate: d_model ≥ kVeGateChannels (InputError).
void require_ve_gate_width(const Config& c);

}  // namespace mixbench::layers
