// The sparse-attention family's methods (moba, dsa, qsa, nsa, seer) share nanochat's attention
// layer up to the attention call (dense.cpp's dense_full): projections c_q/c_k/c_v, the
// value-embedding gate on the backbone's value-embedding layers, RoPE (half-split, nanochat's
// sign), QK RMSNorm, ×1.2; c_proj after. Each method restricts the attention to the keys it
// selects; sparse_method builds its MethodSpec around these shared pieces.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <functional>
#include <string>
#include <vector>

#include "harness/registry.h"
#include "reference/sparse.h"

namespace mixbench {

namespace sparse_layer {
struct Dims {
  int64_t D, H, Hkv, dh;
};
Dims dims(const Config& c);                     // kv_ratio: query heads per KV head, 0 = one KV head
int64_t ve_dim(const Config& c, const LayerCtx& ctx);  // Hkv·dh on value-embedding layers, else 0
std::vector<ParamDef> attention_params(const Config& c, const LayerCtx& ctx);  // c_q, c_k, c_v, c_proj (+ ve_gate)
int64_t attention_matmul_params(const Config& c, const LayerCtx& ctx);
// The shared layer's tensors for its FP64 reference (reference/sparse.h); the method adds its own.
reference::SparseLayerWeights attention_weights(const TensorMap& in);
TensorMap make_layer_inputs(const Config& c, const LayerCtx& ctx, int64_t B, int64_t T, at::Generator& gen);
struct QKV {
  at::Tensor q, k, v;  // q [B,T,H,dh] and k [B,T,Hkv,dh] after RoPE and QK-norm; v [B,T,Hkv,dh]
  at::Tensor k_raw;    // the key projection before RoPE and QK-norm [B,T,Hkv,dh]
};
QKV qkv(const TensorMap& in, const Config& c);
// The block selection of block scores [B,S,T,N] through op block_topk (mixers/sparse/block_topk_op.cpp;
// no gradient): own_counted = the own block forced and counted among topk (moba), else appended after
// the topk best complete history blocks (nsa, seer, qsa). Returns block_indices [B,S,T,K].
at::Tensor select_blocks(const at::Tensor& scores, int64_t block, int64_t topk, bool own_counted, Backend backend);
// Backbone config plus kv_ratio and rope_base (the attention layer's own knobs).
ConfigSpec layer_config();
// Full-attention warm-up of the methods trained with an indexer / gate KL (dsa, qsa, seer; seed
// 001): for the first N training steps (LayerCtx::step in [0, N)) the layer selects every causal
// key (dense causal attention) and the KL, with the teacher over the full history, still trains the
// indexer. Outside training (step -1) the selection is always active. N is a fraction of the run,
// `full_attention_warmup_frac` (seed 001: 512 of 46,875 updates), which the trainer turns into
// `full_attention_warmup_steps` (resolve_full_attention_warmup, suites/train_presets.h); an explicit
// `full_attention_warmup_steps` ≥ 0 overrides it. A layer at a training step with the steps still
// unresolved (-1) throws UsageError.
ConfigSpec& add_warmup_knob(ConfigSpec& s);
bool full_attention_warmup(const Config& c, const LayerCtx& ctx);
}  // namespace sparse_layer

// What a sparse method adds to the shared layer: its knobs, ops, parameters (attention_params
// plus its own), FP64 reference, forward, accountant and conformance cases.
struct SparseMethodDesc {
  std::string name, summary, citation;
  bool warmup = false;                      // the full-attention warm-up knob (add_warmup_knob)
  std::function<void(ConfigSpec&)> knobs;   // the method's own fields and rules, after layer_config's
  std::vector<std::string> ops;
  std::function<std::vector<ParamDef>(const Config&, const LayerCtx&)> params;
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&)> reference;
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&, Backend)> forward;
  std::function<LayerCost(const Config&, const LayerCtx&, const CostQuery&)> account;
  std::function<std::vector<CaseDef>(const ConfigSpec&)> cases;  // from the method's full config
};
// The MethodSpec of a sparse-family layer: family "sparse", layer_config (+ warm-up knob) + the
// method's knobs, the shared layer inputs and value-embedding rule. No CUDA registration: the code
// is device-agnostic, but at bf16 the selection flips near-tied keys against the FP64 reference, so
// layer-level conformance would need the reference to take the optimized path's selection; until
// it does, the layers are checked on the CPU only.
MethodSpec sparse_method(const SparseMethodDesc& desc);

}  // namespace mixbench
