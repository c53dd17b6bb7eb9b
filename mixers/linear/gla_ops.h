// Optimized CPU paths of the gated linear-attention ops `simple_gla` (scalar log decay per head)
// and `gla` (log decay per key channel), and their one-token decode steps.
// Layout as flash-linear-attention: q,k [B,T,H,K], v [B,T,H,V], g [B,T,H] (simple_gla) or
// [B,T,H,K] (gla), states [B,H,K,V]. o_t = S_tᵀ (scale·q_t).
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/tensor_map.h"

namespace mixbench::linear {

constexpr int64_t kGlaChunk = 64;     // chunk length of the chunked algorithm
// simple_gla: chunks per block of the CPU path (the sequence is processed block by block, the
// state carried between blocks, so the working set is bounded by the block and not by T)
constexpr int64_t kGlaBlockChunks = 8;

// Chunked forward (differentiable through autograd). h0 may be undefined (zero state).
// Returns (o [B,T,H,V], ht [B,H,K,V]).
std::pair<at::Tensor, at::Tensor> simple_gla_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& g, double scale, const at::Tensor& h0);
// CPU path of simple_gla_chunked (mixers/linear/gla_cpu.cpp): fp32 / fp64 inputs on the CPU run
// a forward on raw buffers in the input dtype, parallel over (batch, head); with autograd recording,
// it is wrapped in an autograd function whose backward recomputes simple_gla_chunked and
// differentiates it. Everything else (other devices, mixed dtypes) runs simple_gla_chunked;
// bf16 / fp16 inputs are computed in fp32 (o in the input dtype, ht fp32).
std::pair<at::Tensor, at::Tensor> simple_gla_chunked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const at::Tensor& g, double scale, const at::Tensor& h0);
std::pair<at::Tensor, at::Tensor> gla_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& g, double scale, const at::Tensor& h0);
// CPU path of gla_chunked (mixers/linear/delta_cpu.cpp): fp32 / fp64 inputs on the CPU run a
// forward on raw buffers (the per-key-gate chunk kernel without the delta rule), parallel over
// (batch, head); with autograd recording its backward recomputes gla_chunked and differentiates it.
// Everything else runs gla_chunked; bf16 / fp16 inputs are computed in fp32.
std::pair<at::Tensor, at::Tensor> gla_chunked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& g, double scale, const at::Tensor& h0);

// CUDA forward kernel of simple_gla (mixers/linear/simple_gla_cuda.cu): fp32 accumulation and
// state, o in the input dtype, ht fp32. Eligible inputs: q, k, v, g on one CUDA device, q/k/v of
// one dtype among fp32, bf16 and fp16, K and V in {64, 128}, any T; h0 undefined or [B,H,K,V] on
// that device. simple_gla_cuda_eligible is false for everything else, and always false in a build
// without CUDA. simple_gla_fwd_cuda is not differentiable; simple_gla_cuda wraps it in an autograd
// function whose backward recomputes through simple_gla_chunked.
bool simple_gla_cuda_eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                              const at::Tensor& h0);
#if defined(MIXBENCH_WITH_CUDA)
std::pair<at::Tensor, at::Tensor> simple_gla_fwd_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      const at::Tensor& g, double scale, const at::Tensor& h0);
std::pair<at::Tensor, at::Tensor> simple_gla_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& g, double scale, const at::Tensor& h0);
#endif

// One decode step: q_t,k_t [B,H,K], v_t [B,H,V], g_t [B,H] (simple_gla) or [B,H,K] (gla),
// state [B,H,K,V] -> (o_t [B,H,V], new state).
std::pair<at::Tensor, at::Tensor> simple_gla_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& g, double scale, const at::Tensor& state);
std::pair<at::Tensor, at::Tensor> gla_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& g, double scale, const at::Tensor& state);

// Matmul FLOPs the chunked algorithms execute per padded chunk of one head (what FlopCounter sees):
//   simple_gla: 2C²K (q kᵀ) + 2C²V (A v) + 2CKV (chunk state update kᵀv) + 2CKV (inter-chunk readout)
//   gla:        simple_gla's terms + 2·C·c·K for the diagonal sub-chunk blocks (c = 16), done as
//               batched dot products.
// Element-wise work (decays, masks, the state recursion S ← e^{b_L} S + U) is not included.
double simple_gla_chunk_flops(int64_t K, int64_t V);
double gla_chunk_flops(int64_t K, int64_t V);
// Padded length: ceil(T / 64)·64.
int64_t gla_padded_len(int64_t T);

using GlaChunkFn = std::pair<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                         const at::Tensor&, double, const at::Tensor&);
using GlaStepFn = GlaChunkFn;
// The op invariants (inputs: q, k, v, g and optional h0, cast to dtype on device, no grad):
//   chunked_vs_recurrent  chunked == the decode step applied token by token (o and ht)
//   prefill_decode        chunked prefill of T−n tokens then n decode steps == chunked prefill(T)
//   split_state           two chunked passes with the state carried == one pass (o and ht)
// Each value is the larger rel-RMS error over o and ht.
std::vector<std::pair<std::string, double>> gla_family_invariants(const TensorMap& inputs, double scale,
                                                                  GlaChunkFn chunked, GlaStepFn step,
                                                                  at::ScalarType dtype, bool cuda);

}  // namespace mixbench::linear
