// FP64 references for the block-selecting sparse-attention layers (QSA, NSA, Seer): plain loops
// over tokens on LibTorch FP64 tensors; selections are made on detached values with explicit
// stable sorts. Nothing here is shared with mixers/sparse.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "reference/sparse.h"

namespace mixbench::reference {

// The layer's tensors by parameter name: c_q, c_k, c_v, c_proj, ve_gate (VE layers) and the
// method's own (qsa_*, nsa_*, seer_*).
struct BlockLayerWeights {
  std::map<std::string, at::Tensor> t;
};
struct BlockLayerShape {
  int64_t n_head, n_kv_head, head_dim;
  double rope_base;
};
struct BlockOut {
  at::Tensor y, aux_loss;
};

// Each layer takes an optional LayerSelection (reference/sparse.h): a forced selection to attend
// with, and the selection and candidate scores out.
// Shared selection rule: query t (own block c = t / block) attends to the keys s ≤ t of its own
// block and of the `topk` best complete history blocks i < c (descending score, ties to the lower
// block). Attention scale head_dim^-½.

// Op block_topk: per row (b, s, t) of scores [B,S,T,N] with own block c = t / block: appended
// (counted = false) the min(topk, N) best blocks i < c (descending score, ties to the lower block, −1
// where there are fewer) then c; counted the block c first, then the min(topk, N) − 1 best blocks
// i < c, −1 padded. Returns [B,S,T,K] int64.
at::Tensor block_topk(const at::Tensor& scores, int64_t block, int64_t topk, bool counted);

// QSA: indexer on the detached input x (H_I = idx_heads of d_I = idx_dim, group query heads per
// pooled key head), q^I_t RoPE'd at t, k^I_i = RoPE(RMSNorm(mean of W^I_k x over block i)) at
// i·block (partial NeoX RoPE on the first rope_dim dims), I_{t,i} = Σ_j ReLU(q^I_{t,j}·k^I_{i,j/group}/√d_I).
// aux_loss = mean over tokens of KL(teacher ‖ softmax(I)) over the selected history blocks, the
// teacher being the head-mean of the main attention probabilities over the attended keys
// (detached), max-pooled per block, renormalised over the selected history blocks.
BlockOut qsa_layer(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                   int64_t idx_heads, int64_t idx_dim, int64_t group, int64_t rope_dim, int64_t block, int64_t topk,
                   LayerSelection* sel = nullptr);

// NSA: y = c_proj(Σ_c σ(W_g x)_{c,h}·o^c) over c ∈ {cmp, slc, win}: compressed attention over the
// complete blocks (K̃_i = W_ck·vec(k_block), Ṽ likewise), selection by the compressed
// probabilities summed over each KV group's query heads, window of `window` keys.
at::Tensor nsa_layer(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                     int64_t block, int64_t topk, int64_t window, LayerSelection* sel = nullptr);

// Seer: gate logits S_{t,h,i} = (W^G_q[h] q_{t,h})·K̃_{i,h'}/√d_g on the layer's detached q (after
// RoPE and QK-norm) with, pooled_rope (the original AttnGate's key side), K̃_{i,h'} = the layer's
// rotation at position i·block (block i's first position) over all d_g dims of W^G_k[h'] [max; min;
// mean over block i of the layer's unrotated QK-normed keys k⁰_{h'}]; otherwise (rotated) K̃_{i,h'} =
// W^G_k[h'] [max; min; mean of k_{h'} over block i] on the keys after RoPE and QK-norm, not rotated
// again. Per-head selection; aux_loss = mean over (token, head) rows of KL(block-max of full
// causal attention renormalised over the history blocks ‖ softmax(S)).
BlockOut seer_layer(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                    int64_t block, int64_t topk, bool pooled_rope, LayerSelection* sel = nullptr);

}  // namespace mixbench::reference
