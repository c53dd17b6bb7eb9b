// The backbone's element-wise work of a static-cache decode step fused into one launch per step
// boundary: each function is one mixbench op (harness/op_scope.h), one kernel on a GPU for fp32,
// bf16 and fp16 rows (harness/decode_ops_kernel.cu, forward only: no gradient flows through them);
// elsewhere (the CPU, fp64, rows wider than the kernels take) the backbone's unfused LibTorch ops,
// bit for bit as before. The fused kernels round to the dtype wherever the unfused path stores a
// tensor, so a fused step stays within one rounding of the unfused one.
#pragma once
#include <ATen/core/Tensor.h>

#include "harness/decode_knobs.h"

#include <vector>

namespace mixbench {

// The backbone's RMSNorm over the last dimension (no gain, eps kRmsEps, harness/backbone.h):
// LibTorch's fused kernel on a GPU (fp32 statistics for half inputs), x·rsqrt(mean(x²) + eps) in
// x's dtype elsewhere. One mixbench op ("mixbench::rms_norm"); defined in harness/backbone.cpp.
at::Tensor backbone_rms_norm(const at::Tensor& x);

// What the residual stream mixes into the residual before the norm.
enum class ResidualMix {
  None,     // r = s
  Scaled,   // r = a·s + b·z: nanochat's resid / x0 mix (scaled_sum), a and b one element each
  Backout,  // r = s − b·z: nanochat's backout (b one element)
};

struct ResidualNorm {
  at::Tensor residual;  // r
  at::Tensor normed;    // backbone_rms_norm(r) (residual_norm only)
  at::Tensor sum;       // s (only when asked for)
  at::Tensor out;       // [relu](normed·Wᵀ)[²] (residual_norm_linear only)
};

// s = x + y (y undefined: s = x), r = mix(s), and r's RMSNorm: a sublayer's output added to the
// residual, the stream's update for the next sublayer and that sublayer's normed input in one pass.
// x, y, z: [..., D] of one dtype; a, b: one-element tensors (undefined where the mix does not read
// them). `keep_sum`: also return s.
ResidualNorm residual_norm(const at::Tensor& x, const at::Tensor& y, ResidualMix mix, const at::Tensor& a,
                           const at::Tensor& b, const at::Tensor& z, bool keep_sum = false);

// A decode step's embedding with nanochat's smear: e = rms_norm(wte[idx]), x = e + λ·σ(e[..., :G]
// wᵀ)·prev, and prev ← e in place (a static cache's previous embedding). idx [B,1] int64, wte
// [vocab, d], w [1, G], λ one element, prev [B,1,d]. `tables` (the layers' value embeddings,
// [vocab, w_t] each): their rows at idx, [B,1,w_t] each, gathered in the same launch on a GPU
// (up to 32 tables; more take the unfused ops).
struct EmbedStep {
  at::Tensor x;                     // [B,1,d]
  std::vector<at::Tensor> gathered;  // one per table
};
EmbedStep embed_smear_step(const at::Tensor& wte, const at::Tensor& idx, const at::Tensor& w, const at::Tensor& lambda,
                           const at::Tensor& prev, const std::vector<at::Tensor>& tables = {});

// The MLP's first half relu(x Wᵀ)² (the backbone's relu_square(at::linear(x, W))) for a decode
// step's few rows: x [..., K] with at most 8 rows, W [N, K]; one kernel on a GPU (the product
// rounded to the dtype before the activation, as the GEMM stores it), the two ops otherwise.
at::Tensor linear_relu_square(const at::Tensor& x, const at::Tensor& W);
// residual_norm and then a GEMV of its normed rows with W [N, D] (out: linear_relu_square(normed, W)
// when relu_square, else linear_rows(normed, W)) in one op: one kernel on a GPU for up to 8 rows of at
// most 12000 numbers in all (every block of the GEMV forms the normed rows itself), the ops one after
// the other otherwise. Returns residual, sum (keep_sum), out, and normed when `with_normed`.
ResidualNorm residual_norm_linear(const at::Tensor& x, const at::Tensor& y, ResidualMix mix, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor& z, bool keep_sum, const at::Tensor& W,
                                  bool relu_square, bool with_normed = false);
// x [..., K] · W [N, K]ᵀ; for at most decode_cuda_ops::kGemvRows rows of a CUDA floating tensor one
// GEMV launch (fp32 accumulation, rounded to x's dtype), otherwise at::linear.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& W);

// nanochat's logit softcap cap·tanh(l/cap) in at least fp32 (half logits are upcast first); when
// `advance` is given (int64 [1], a static cache's device position) it is incremented by one in the
// same launch: the last work of a decode step.
at::Tensor softcap_logits(const at::Tensor& logits, double cap, const at::Tensor& advance = at::Tensor());

// What greedy_tokens_into keeps between calls on a GPU: the kernel's arrival counters (zeroed when
// made, left zero by every launch) and its partials. Made at the first call, so that call must not be
// under a CUDA-graph capture (a captured decode step runs it once eagerly first).
struct GreedyScratch {
  at::Tensor counters, part_v, part_i;
};
// out ← the greedy token of every row of logits [..., V]: at::argmax(-1) (NaN above every number,
// the first index among equals), stored into out (int64, one element per row, contiguous). On a GPU
// one kernel launch (MIXBENCH_DECODE_ARGMAX_KERNEL, harness/decode_knobs.h); otherwise at::argmax
// and a copy.
void greedy_tokens_into(const at::Tensor& logits, const at::Tensor& out, GreedyScratch& scratch);

}  // namespace mixbench
