// Block-sparse causal attention on CUDA: the C entry points of mixers/sparse/block_sparse_kernel.cu.
// The autograd wrapper is block_sparse_attention_fast (mixers/sparse/block_sparse_attention_op.cpp).
//
// Contract (op block_sparse_attention): q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,D] (Dv = D),
// block_indices [B,Hkv,NQ,topk] int64 (−1 = empty slot), NQ = ceil(T / q_block). Query t (row
// t / q_block) of head h attends through KV head h / (H/Hkv) to the keys s ≤ t of every listed
// block (keys i·bs … min((i+1)·bs, T) − 1); softmax over those keys only, 0 without any key. Slots
// outside [0, ceil(T/bs)) are skipped (not read). All tensors contiguous, q/k/v/o of one type.
//
// Nothing here synchronises with the host or sizes anything from device data: a captured CUDA
// graph can hold every launch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/common/rope_kernel.h"

namespace mixbench::bsa_cuda {

using Dtype = layers::rope_cuda::Dtype;

struct Shape {
  int B, T, H, Hkv, D, bs, qb, NQ, topk;
  float scale;
  __host__ __device__ int NB() const { return (T + bs - 1) / bs; }
  // (batch, KV head, key block) segments of the transposed selection
  __host__ __device__ int64_t segments() const { return int64_t(B) * Hkv * NB(); }
  // entries of block_indices: the transposed selection's capacity
  __host__ __device__ int64_t entries() const { return int64_t(B) * Hkv * NQ * topk; }
  // query rows per work item of the dk/dv pass (about 256 queries)
  __host__ __device__ int rows_per_item() const { return qb >= 256 ? 1 : 256 / qb; }
  // upper bound on the dk/dv pass's work items: Σ_seg ceil(count_seg / R) ≤ E / R + non-empty segments
  __host__ __device__ int64_t max_items() const {
    const int64_t E = entries(), S = segments();
    return E / rows_per_item() + 1 + (E < S ? E : S);
  }
};

// Head dimensions the kernels are built for (D = Dv); others take the LibTorch path.
bool supported_head_dim(int D);

// o [B,T,H,D] in q's type; lse [B,T,H] fp32: log2 of the softmax normaliser in units of
// log2(e)·scale·q·k (the backward's p = exp2(log2(e)·scale·q·k − lse)), +inf for a query without keys.
void forward(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx, void* o,
             float* lse, cudaStream_t stream);

// The transposed selection, step 1: count[seg] += 1 for every listed block (count [segments] int32,
// zeroed by the caller).
void count_selections(const Shape& s, const int64_t* idx, int* count, cudaStream_t stream);
// Step 2 (after the caller's exclusive scans row_off = [0, cumsum(count)], item_off = [0,
// cumsum(ceil(count / rows_per_item))], both [segments + 1] int32): rows[row_off[seg] + …] = the
// query rows r that list the segment's block (any order; cursor [segments] int32 zeroed).
void fill_selections(const Shape& s, const int64_t* idx, const int* row_off, int* cursor, int* rows, cudaStream_t stream);

// dq [B,T,H,D] in q's type and delta [B,T,H] fp32 = Σ_d dO·O, query-stationary like the forward.
void backward_dq(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const void* o, const void* dout,
                 const int64_t* idx, const float* lse, void* dq, float* delta, cudaStream_t stream);
// dk, dv [B,T,Hkv,D] fp32, zeroed by the caller, accumulated (atomically, one add per key element and
// work item) by a key-block-stationary pass over the query rows that selected each block; after
// backward_dq (it reads delta).
void backward_dkdv(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const void* dout,
                   const float* lse, const float* delta, const int* row_off, const int* item_off, const int* rows,
                   float* dk, float* dv, cudaStream_t stream);

}  // namespace mixbench::bsa_cuda
