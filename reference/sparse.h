// FP64 references for the sparse-attention family: plain per-token loops over LibTorch FP64
// tensors (autograd gives their gradients). Nothing here is shared with mixers/sparse.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

namespace mixbench::reference {

// Token-sparse causal attention (FLA naive_dsa with given indices). q [B,T,H,D],
// k [B,T,Hkv,D], v [B,T,Hkv,Dv], indices [B,T,K] int64 shared by all heads, −1 = empty slot.
// Query head h reads KV head h / (H/Hkv). o_t = softmax over the selected keys only of
// scale·q_t·k_s, times v_s. A query with no selected key gets o_t = 0.
at::Tensor sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& indices, double scale);

// DSA lightning indexer (FLA naive_dsa_indexer): I[t,s] = Σ_j w[t,j]·act(scale·q_idx[t,j]·k_idx[s])
// for s ≤ t (act = ReLU or identity; w = 1 when w_idx is undefined). Returns indices [B,T,topk]
// int64: the min(topk, t+1) highest-scoring visible keys in descending score order, ties broken
// by the lowest key index, the remaining slots −1.
at::Tensor dsa_indexer(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx, int64_t topk,
                       double scale, bool relu);

// Block-sparse causal attention: query t (row r = t / q_block) of head h attends, through KV head
// h / (H/Hkv), to the keys s ≤ t of every block i listed in block_indices[b, h_kv, r, :] (block i =
// keys i·block_size … (i+1)·block_size − 1, clipped to T); −1 = empty slot. A query with no such key
// gets o_t = 0.
at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& block_indices, int64_t block_size, int64_t q_block,
                                  double scale);

// The selection of a sparse layer's reference (every layer function below takes an optional one).
// `forced` (defined): the layer attends where it says — and its auxiliary loss covers it — instead
// of selecting itself, so that conformance compares the attention, outputs and gradients of the
// optimized path on that path's own selection; the selection itself is compared with `chosen` of a
// run without `forced`, tie-aware against `scores`. Layouts are the optimized layer's selection
// output (mixers/sparse): DSA key indices [B,T,min(topk,T)]; MoBA blocks [B,H,T,min(topk,NB)], the
// own block first; QSA [B,1,T,n+1], NSA [B,Hkv,T,n+1], Seer [B,H,T,n+1] with n = min(topk, ⌊T/block⌋)
// history blocks (−1 padded) then the own block. NB = ⌈T/block⌉.
struct LayerSelection {
  at::Tensor forced;  // in: undefined = the reference selects
  at::Tensor chosen;  // out: the selection attended with (int64, CPU)
  // out: FP64 scores of each row's candidates, [rows..., T] (DSA: keys) or [rows..., NB] (blocks):
  // the reference's score, −inf for no candidate, +inf for the own block (forced, never a tie)
  at::Tensor scores;
};

// Weights of a nanochat attention layer plus, for DSA, its lightning indexer.
struct SparseLayerWeights {
  at::Tensor c_q, c_k, c_v, c_proj, ve_gate;            // ve_gate undefined when the layer has no VE
  at::Tensor idx_wq, idx_wk, idx_w, idx_kn_w, idx_kn_b;  // DSA indexer (undefined for MoBA)
};

// MoBA layer (MoonshotAI/MoBA moba_naive inside nanochat's attention layer): per token t and
// query head h, gate s_i = q_t·mean(k over block i) (no scale) for blocks i ≤ t / block; the
// query's own block always chosen and counted; the top `topk_blocks` blocks (ties: lower block
// first); attention over their keys s ≤ t. Returns y [B,T,d].
at::Tensor moba_layer(const at::Tensor& x, const at::Tensor& ve, const SparseLayerWeights& w, int64_t n_head,
                      int64_t n_kv_head, int64_t head_dim, double rope_base, int64_t block, int64_t topk_blocks,
                      LayerSelection* sel = nullptr);

// DSA layer: nanochat's attention layer whose attention is restricted to the top-k keys of the
// DeepSeek-V3.2 lightning indexer (on the detached layer input), plus the indexer's KL loss
// (mean over tokens of KL(p_t ‖ softmax(I_t)) over the selected set, p_t = main attention
// probabilities summed over heads and L1-normalised, detached). Returns {y, aux_loss}.
struct DsaOut {
  at::Tensor y, aux_loss;
};
DsaOut dsa_layer(const at::Tensor& x, const at::Tensor& ve, const SparseLayerWeights& w, int64_t n_head,
                 int64_t n_kv_head, int64_t head_dim, double rope_base, int64_t idx_heads, int64_t idx_dim,
                 int64_t idx_rope_dim, int64_t topk, LayerSelection* sel = nullptr);

}  // namespace mixbench::reference
