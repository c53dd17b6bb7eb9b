// Optimized paths of the sparse-attention family's ops (LibTorch, gather-based).
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

// q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv], indices [B,T,K] int64 (−1 = empty slot, shared by all
// heads) -> o [B,T,H,Dv]. Softmax over the selected keys only; a query with no key gets 0.
at::Tensor sparse_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& indices, double scale);

// q_idx [B,T,HI,DI], k_idx [B,T,DI], w_idx [B,T,HI] (undefined = all ones) -> indices [B,T,topk]:
// top-k causal keys by I[t,s] = Σ_j w[t,j]·act(scale·q_idx[t,j]·k_idx[s]), descending score, ties
// to the lowest key index, −1 padded.
at::Tensor dsa_indexer_cpu(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx,
                           int64_t topk, double scale, bool relu);

// Every key s ≤ t selected, −1 elsewhere: [B,T,T] int64 on `like`'s device.
at::Tensor causal_full_indices(int64_t B, int64_t T, const at::Tensor& like);

}  // namespace mixbench
