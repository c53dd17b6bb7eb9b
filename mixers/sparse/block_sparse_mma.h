// Block-sparse causal attention on tensor cores: the C entry points of mixers/sparse/block_sparse_mma.cu,
// for bf16 / fp16 inputs with per-token rows (q_block = 1). The contract is block_sparse_kernel.h's
// (op block_sparse_attention); block_sparse_attention_fast picks these kernels where applies() holds
// and the CUDA-core kernels otherwise.
//
// Everything is key-block-stationary over the transposed selection: a segment is one (batch, KV head,
// key block) and lists the entries (query row r, slot j) that selected its block; its items are the
// (entry, query head g of the KV head's group) pairs, item n = list position n / G, head n % G. A
// work item is one segment and up to `unit` consecutive items of it (items_per_unit below).
//
// Forward (two passes over the gathered tiles, scores on mma.sync m16n8k16, fp32 accumulation):
//   pass 1: every item's max and sum of exp2 over the visible keys of its block -> ml [E·G] float2;
//   merge:  per (b, t, h) the log2 normaliser lse over the query's slots (+inf without any key);
//   pass 2: exp2(score − lse)·V added (fp32 atomics, once per item and block) into o_acc [B,T,H,D].
// Backward (after delta = Σ_d dO·O): one work item of the backward is one segment, one chunk of
// kBwdChunk(bs) keys of its block and up to kBwdUnit items; dk, dv accumulate in registers and are
// added once per work item, dq is added per tile of 32 items (fp32 atomics, the scale folded in).
//
// Nothing synchronises with the host or is sized from device data (CUDA-graph capturable).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/sparse/block_sparse_kernel.h"

namespace mixbench::bsa_mma {

using bsa_cuda::Dtype;
using bsa_cuda::Shape;

// Items per work item: the forward's (one tile of 64) and the backward's (4 tiles of 32).
constexpr int kFwdUnit = 64;
constexpr int kBwdUnit = 128;

// The shapes these kernels take: bf16 / fp16, D ∈ {64, 128}, q_block 1, block_size ≥ 16, and
// entries · G within int32 (item numbers).
bool applies(Dtype dt, const Shape& s);

// Work items of a segment of `count` entries: ceil(count · G / unit). Upper bound over all
// segments (the grid size): Σ_seg ceil(count_seg·G / unit) ≤ E·G / unit + non-empty segments + 1.
int64_t max_items(const Shape& s, int unit);
// Key chunks of a block in the backward's grid (chunks of 64 keys, 32 for blocks of 32 … 63, 16
// below).
int bwd_chunks(const Shape& s);

// The transposed selection with slots (after bsa_cuda::count_selections and the caller's scan
// row_off = [0, cumsum(count)]): ents[row_off[seg] + …] = r·topk + j for every slot j of row r listing
// the segment's block (any order; cursor [segments] int32 zeroed).
void fill_entries(const Shape& s, const int64_t* idx, const int* row_off, int* cursor, int* ents, cudaStream_t stream);

// o_acc [B,T,H,D] fp32 zeroed by the caller -> o_acc = o, lse [B,T,H] as bsa_cuda::forward's;
// ml [E·G] float2 is work space. item_off = [0, cumsum(ceil(count·G / kFwdUnit))] [segments + 1].
void forward(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const int64_t* idx,
             const int* row_off, const int* item_off, const int* ents, float2* ml, float* lse, float* o_acc,
             cudaStream_t stream);

// dq_acc [B,T,H,D], dk, dv [B,T,Hkv,D] fp32 zeroed by the caller, accumulated; delta [B,T,H] fp32 =
// Σ_d dO·O; item_off = [0, cumsum(ceil(count·G / kBwdUnit))].
void backward(Dtype dt, const Shape& s, const void* q, const void* k, const void* v, const void* dout, const float* lse,
              const float* delta, const int* row_off, const int* item_off, const int* ents, float* dq_acc, float* dk,
              float* dv, cudaStream_t stream);

}  // namespace mixbench::bsa_mma
