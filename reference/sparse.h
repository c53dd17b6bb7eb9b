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

}  // namespace mixbench::reference
