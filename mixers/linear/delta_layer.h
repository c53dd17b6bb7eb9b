// Layer-level pieces shared by the delta-rule methods (deltanet, gdn, kda): config knobs, the
// causal short convolution, norms, q/k/v preparation, cases and the common accountant terms.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <string>
#include <vector>

#include "harness/registry.h"
#include "mixers/linear/delta_chunk.h"

namespace mixbench::linear {

constexpr double kDeltaL2Eps = 1e-6;  // fla's l2norm: x / sqrt(Σx² + 1e-6)

struct DeltaDims {
  int64_t d, H, K, V, W;  // width, heads, key/value head dims, short-conv kernel
  double eps;             // output RMSNorm eps
};
DeltaDims delta_dims(const Config& c);

// backbone_config() + head_v_dim (0 = head_dim), conv_size, norm_eps.
ConfigSpec delta_method_config();

// Causal depthwise short convolution with SiLU: y[t,c] = silu(Σ_{i<W} w[c,i]·x[t−W+1+i, c]) with
// zeros before the sequence (fla's ShortConvolution, weight [C,1,W] stored as [C,W], no bias).
// Written as an explicit sum of W shifted products, which FlopCounter does not see: the
// accountant adds it as its own documented term, 2·W FLOPs per channel per token.
at::Tensor short_conv_silu(const at::Tensor& x, const at::Tensor& w);
// x·rsqrt(Σx² + 1e-6) and the output RMSNorm with its gain over the last dimension (on a GPU one
// fused pass each way: harness/fused_ops.h; gdn and kda call rms_norm_gated with their gates).
at::Tensor l2norm(const at::Tensor& x);
at::Tensor rms_norm_gain(const at::Tensor& x, const at::Tensor& w, double eps);

// q, k, v of every delta layer: projections, short conv + SiLU, the value embedding (VE layers:
// v += 3·sigmoid(W_veg x[..., :12])·ve, one gate per head, added after the conv), L2-normalized q, k.
// On a GPU the three projections are one GEMM against the concatenated weights and the three
// convolutions one kernel launch (the same arithmetic; the CPU path is three of each).
struct DeltaQKV {
  at::Tensor q, k, v;  // [B,T,H,K], [B,T,H,K], [B,T,H,V]
  at::Tensor extra;    // [B,T,Σ rows] x times the `extra` projections of delta_qkv_cached (undefined without)
};
DeltaQKV delta_qkv(const TensorMap& in, const DeltaDims& d);

// The same with a decode cache (MethodSpec::prefill/decode). Cache entries: "q_tail", "k_tail",
// "v_tail" [B,W−1,C], the last W−1 pre-conv projections (zeros before the sequence).
// decode = false: x [B,T,d] from position 0, the tails are (re)written; decode = true: x [B,1,d],
// the conv reads and shifts the tails. `extra`: names of further projections of x in `in` (a
// method's gates), returned in DeltaQKV::extra in that order.
// A static cache keeps one tail "qkv_tail" [B,W−1,2HK+HV] and, prepared at prefill (weights do not
// change while decoding; cache_bytes skips "w." entries), "w.in" = q|k|v|extra projections (then
// the value-embedding gate's rows widened to d with zeros on VE layers) and "w.conv" = the three
// convs' weights: its decode step is one GEMM, one conv step over q|k|v and one L2 norm over q|k.
DeltaQKV delta_qkv_cached(const TensorMap& in, const DeltaDims& d, TensorMap& cache, bool decode,
                          const std::vector<std::string>& extra = {});
// The delta core with the cache: decode = false runs the op (q,k,v [B,T,...]) and stores its final
// state as cache "state" [B,H,K,V] (FP32 for half inputs), "pos" = T; decode = true applies
// delta_step to the one token and advances "pos". g undefined for DeltaNet. Scale K^-0.5.
at::Tensor delta_core_cached(const std::string& op, const DeltaQKV& qkv, const at::Tensor& beta, const at::Tensor& g,
                             Backend backend, TensorMap& cache, bool decode);

// Gated DeltaNet's decode step over a static cache from its gates' raw projections b_lin, a_lin
// [B,1,H]: β = σ(b_lin), g = neg_a·softplus(a_lin + dt_bias) (neg_a = −exp(A_log), dt_bias with the
// gate offset, both [H], prepared at prefill), then delta_core_cached's step. On a GPU one kernel
// that forms the gates itself (fp32); elsewhere those LibTorch ops and delta_core_cached.
at::Tensor gated_delta_static_step(const DeltaQKV& qkv, const at::Tensor& b_lin, const at::Tensor& a_lin,
                                   const at::Tensor& neg_a, const at::Tensor& dt_bias, Backend backend, TensorMap& cache);

// Gated DeltaNet's whole decode step over a static cache prepared at prefill ("w.in" holding
// q|k|v|b|a|g projections, then the value-embedding gate's rows on VE layers; "w.neg_a",
// "w.dt_bias"): the joint GEMM and the conv step, then the L2 norms of q and k, the value
// embedding's gate, gated_delta_static_step and the output's gated RMSNorm (gain norm_w, eps
// norm_eps, silu of the g projection) as one op ("mixbench::gdn_step"): one kernel on a GPU
// (decode_cuda::gdn_step), elsewhere those ops unfused. x [B,1,d]; returns o [B,1,H,V] before o_proj.
at::Tensor gdn_static_step(const TensorMap& in, const DeltaDims& d, TensorMap& cache, const at::Tensor& norm_w,
                           double norm_eps, Backend backend);

// Parameters every delta layer has: q/k/v projections and convs, b_proj, o_norm, o_proj, ve_gate.
std::vector<ParamDef> delta_common_params(const DeltaDims& d, const LayerCtx& ctx);
TensorMap delta_make_inputs(const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen);
std::vector<CaseDef> delta_cases(const ConfigSpec& spec, const std::string& extra = "");
// gdn/kda knob `gate_bias_offset` (default 0 = fla): a constant added inside the decay gate's
// softplus, g = −exp(A_log)·softplus(… + dt_bias + offset). Conformance draws every Scalar
// parameter as 1 + 0.25·N(0,1), so A_log ≈ 1 and dt_bias ≈ 1 give g ≈ −3.6 per token: the state
// forgets within a token or two, the output RMSNorm then removes almost all dependence on q and k,
// and their gradients drown in rounding (finite differences and fp32 gradients fail for that
// reason alone). The layer cases set offset −5, which puts the gate where fla's init puts it
// (dt_bias ≈ softplus⁻¹(0.001…0.1)) so that the recurrence carries memory.
void add_gate_offset_knob(ConfigSpec& spec);
int64_t delta_ve_dim(const Config& c, const LayerCtx& ctx);

// A delta-family layer's body: forward (cache null), prefill (cache set, decode false) or one
// decode step (decode true).
using DeltaRunFn = TensorMap (*)(const TensorMap& in, const Config& c, Backend backend, TensorMap* cache, bool decode);
struct DeltaMethodDesc {
  std::string name, summary, citation, op;
  DeltaRunFn run;
  std::function<std::vector<ParamDef>(const Config&, const LayerCtx&)> params;
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&)> reference;
  std::function<LayerCost(const Config&, const LayerCtx&, const CostQuery&)> account;
  bool gate_offset = false;  // add_gate_offset_knob
  std::string case_extra;    // extra config of the conformance cases
};
// flash-linear-attention's names of the parameters every delta layer shares (q_proj.weight,
// k_proj.weight, v_proj.weight, b_proj.weight, q_conv1d.weight [C,1,W] as our q_conv [C,W], k_conv1d,
// v_conv1d, o_norm.weight, o_proj.weight) and the deviations they share (value embeddings).
ParamAliases delta_fla_aliases(const DeltaDims& d);
// The decay gate's names (A_log, dt_bias, as fla's) and its deviation (gate_bias_offset), for the
// layers with fla's per-head or per-channel decay (gdn, kda).
void add_fla_decay_aliases(ParamAliases& a);

// The MethodSpec of a delta-family layer (family linear, delta_method_config, the shared inputs,
// cases and VE rule; forward / prefill / decode through `run`).
MethodSpec delta_method(const DeltaMethodDesc& desc);

// FLOPs per token that FlopCounter cannot see in a delta layer's forward at length T: the short
// convolutions (2·W·(2HK + HV)) and the chunk's triangular solve. The audit adds them to the
// counter's number before comparing with the accountant's fwd_flops.
double delta_conv_flops(const DeltaDims& d);
double delta_uncounted_flops(const DeltaDims& d, int64_t T);

// The accountant once the method has counted its parameters:
//   fwd    = 2·N_matmul + chunk core (matmuls + solve, delta_chunk_flops) + short conv
//   nanochat core (training, 3× forward) = 3·(chunk core + short conv)
//   decode = 2·N_matmul + short conv + delta_step_flops
//   state  = H·K·V FP32 recurrent state + (W−1)·(2HK + HV) conv cache in the activation dtype
//   act    ≈ dtype bytes × (x + pre/post-conv q,k,v + o, normed o, gate (H·V) + β, g)
LayerCost delta_account(const DeltaDims& d, int64_t n_matmul, int64_t n_conv, int64_t n_scalar,
                        int64_t gate_width, DeltaGate gate, const CostQuery& q, const std::string& note);

}  // namespace mixbench::linear
