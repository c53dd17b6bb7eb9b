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
// The block selection of block scores [B,S,T,N] through block_topk_fast (op block_topk's contract,
// mixers/sparse/block_topk_op.cpp, unchecked: the scores are valid by construction; no gradient, no
// host synchronisation): own_counted = the own block forced and counted among topk (moba), else
// appended after the topk best complete history blocks (nsa, seer, qsa). Returns block_indices
// [B,S,T,K].
at::Tensor select_blocks(const at::Tensor& scores, int64_t block, int64_t topk, bool own_counted);

// The NVTX range "<method>.<op>.forward" that call_op opens around an op, for the layers' direct
// calls of the ops' unchecked entry points (profiles filter on it).
std::string op_range(const std::string& op);

// Memory-bounded score tensors. The layers compute their [T,T]-sized intermediates (teachers' full
// attention probabilities, indexer scores against every block) in chunks of query rows, each chunk's
// working set at most about kChunkBytes, so that T = 64K fits; the chunked results equal the
// unchunked ones to rounding (each row's softmax runs over the keys up to its chunk's last query
// instead of all T, adding fewer exact zeros).
constexpr int64_t kChunkBytes = int64_t(256) << 20;
// Query rows per chunk for `bytes_per_row` working bytes per query row: at least 1.
int64_t chunk_rows(double bytes_per_row);
// The main attention's logits for the query rows [q0, q0 + n) against keys [0, Tk), detached, in
// fp32 for half inputs: q [B,T,H,dh], k [B,T,Hkv,dh] -> [B,H,n,Tk] (scale applied).
at::Tensor dense_logits_rows(const at::Tensor& q, const at::Tensor& k, double scale, int64_t q0, int64_t n, int64_t Tk);
// Seer's teacher: the block-max over each complete history block i < t / bs of query t's full
// causal attention probabilities (per head, detached), renormalised over those blocks; 0 for the
// others: q [B,T,H,dh], k [B,T,Hkv,dh] -> [B,H,T,⌊T/bs⌋], fp32 for half inputs. `chunk` query rows
// at a time (0 = chunk_rows' choice for kChunkBytes).
at::Tensor seer_teacher(const at::Tensor& q, const at::Tensor& k, int64_t bs, double scale, int64_t chunk = 0);
// QSA's teacher: the head-mean of the main attention probabilities over the attended keys (the
// blocks of sel [B,T,n+1] — n history blocks, −1 padded, then the own block — keys s ≤ t),
// detached, max-pooled over each history block sel[..., :n], renormalised over them; 0 on empty
// slots: -> [B,T,n]. `chunk` query rows at a time (0 = chunk_rows' choice).
at::Tensor qsa_teacher(const at::Tensor& q, const at::Tensor& k, const at::Tensor& sel, int64_t bs, double scale,
                       int64_t chunk = 0);
// The working precision of the indexers trained by a KL (dsa, qsa): tensor t of a layer whose input
// x is half precision (bf16, fp16) in fp32, else t as it is. The indexers cast their detached input
// and their weights with it, so that their projections (half-precision products are exact in fp32,
// accumulated in fp32), norms, RoPE, student scores, log-softmax and KL all run in fp32; the casts
// carry the gradients back to the half-precision weights. Not only the scores: the indexer's
// scores pass through a ReLU, and one whose value lies within half-precision rounding of 0 (bf16:
// a few 1e-3 of the scores' RMS) turns its (token, head, key) term's whole gradient on or off.
// With the projections and RoPE in bf16, 1–4 of the 250–3,600 terms of each bf16 conformance case
// flipped, and single flips put the CPU's KL gradients of the indexers' weights up to 0.17 (qsa)
// and 0.040 (dsa) from FP64 at the default seed, up to 0.33 over seeds 1–8 (layer threshold 0.04);
// computing only the scores, log-softmax and KL in fp32 left them unchanged. With the whole indexer
// in fp32 they are within 7.6e-3 at those seeds. The selections keep their own scores' precision
// (dsa_indexer scores in fp32, qsa's block scores in the compute dtype).
at::Tensor indexer_precision(const at::Tensor& t, const at::Tensor& x);
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
// The branch is taken on the host (LayerCtx::step), so a CUDA graph captured during the warm-up
// would replay dense attention after it: the trainer (suites/train.cpp, step_dependent) runs the
// warm-up steps eagerly and captures the step only from the first step after it, whose graph then
// holds the sparse path for the rest of the run. After the warm-up the layers' path depends on no
// host value.
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
  // The FP64 reference, with the selection to attend with (sel.forced, from the inputs' `selection`
  // when given) and the selection and candidate scores it reports (reference::LayerSelection).
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&, reference::LayerSelection&)> reference;
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&, Backend)> forward;
  std::function<LayerCost(const Config&, const LayerCtx&, const CostQuery&)> account;
  std::function<std::vector<CaseDef>(const ConfigSpec&)> cases;  // from the method's full config
  // Incremental decoding (both or neither; mixers/sparse/sparse_decode.h): the hooks keep eager and
  // static caches alike (MethodSpec::static_decode).
  MethodSpec::DecodeFn prefill, decode;
};
// The MethodSpec of a sparse-family layer: family "sparse", layer_config (+ warm-up knob) + the
// method's knobs, the shared layer inputs and value-embedding rule. Forward and reference return
// the layer's selection as output `selection` (registered with register_method_selection,
// harness/method_selection.h; layouts in reference/sparse.h, LayerSelection); the reference given an
// input `selection` attends with it, and the registered scores are the reference's candidate
// scores. With that, layer-level conformance
// compares like with like below fp64, so the layers register their CUDA path (has_cuda): the
// forward runs the *_fast entry points (mixers/sparse/sparse.h) on every backend, without host
// synchronisation.
MethodSpec sparse_method(const SparseMethodDesc& desc);

}  // namespace mixbench
