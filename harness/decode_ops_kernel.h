// The CUDA kernels behind harness/decode_ops.h: the backbone's element-wise work of a static-cache
// decode step (B rows of one token each), one launch per step boundary. Rows are contiguous
// [rows, D] in one dtype (fp32, bf16 or fp16); one block per row, fp32 arithmetic, and a rounding
// to the dtype wherever the unfused LibTorch path materializes a tensor (so that the fused step
// stays within one rounding of the unfused one).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "harness/fused_ops_kernel.h"

namespace mixbench::decode_cuda_ops {

using fused_cuda::Dtype;

// Widest row the row kernels take (its fp32 copy lives in shared memory).
constexpr int kMaxRow = 8192;

enum class Mix {
  None,     // r = s
  Scaled,   // r = a·s + b·z (nanochat's resid / x0 mix; a, b one element each)
  Backout,  // r = s − b·z (nanochat's backout; b one element)
};

// Per row: s = x + y (y null: s = x), r = mix(s), written to `residual` (and s to `sum` when
// non-null), and normed = r·rsqrt(mean(r²) + eps). a, b: one element each on the device, in the
// rows' dtype (null where the mix does not read them).
struct ResidualNormArgs {
  int64_t rows = 0;
  int D = 0;
  Mix mix = Mix::None;
  float eps = 0.f;
  const void *x = nullptr, *y = nullptr, *a = nullptr, *b = nullptr, *z = nullptr;
  void *residual = nullptr, *sum = nullptr, *normed = nullptr;
};
void residual_norm(Dtype dt, const ResidualNormArgs& p, cudaStream_t stream);

// Per row i: e = rms_norm(wte[idx[i]]), the smear gate g = λ·σ(e[:G]·w) and x = e + g·prev[i];
// prev[i] ← e in place. wte [vocab, D], w [G] (G ≤ 32), λ one element, prev and x [rows, D]; idx
// int64 [rows] on the device (an id outside [0, vocab) stops the kernel with a device error).
// In the same launch, row idx[i] of each of n_gather further tables [vocab, width_t] is copied to
// row i of out_t [rows, width_t] (the value embeddings of the step's layers).
constexpr int kMaxGather = 32;
struct EmbedSmearArgs {
  int64_t rows = 0, vocab = 0;
  int D = 0, G = 0;
  float eps = 0.f;
  const int64_t* idx = nullptr;
  const void *wte = nullptr, *w = nullptr, *lambda = nullptr;
  void *prev = nullptr, *x = nullptr;
  int n_gather = 0;
  const void* gather_table[kMaxGather] = {};
  int64_t gather_vocab[kMaxGather] = {};
  int64_t gather_width[kMaxGather] = {};
  void* gather_out[kMaxGather] = {};
};
void embed_smear(Dtype dt, const EmbedSmearArgs& p, cudaStream_t stream);

// The MLP's first half for a few rows: y[r, n] = relu(Σ_k x[r,k]·W[n,k])² with fp32 accumulation,
// the product rounded to dt before the activation (as the unfused GEMM stores it). x [rows, K],
// W [N, K], y [rows, N] contiguous; 1 ≤ rows ≤ kGemvRows. One warp per output column n, reading
// W's row once for every row of x.
constexpr int kGemvRows = 8;
void linear_relu_square(Dtype dt, const void* x, const void* W, void* y, int rows, int64_t N, int64_t K,
                        cudaStream_t stream);
// residual_norm (normed written only where p.normed is given) followed by the GEMV of its normed rows,
// y[r, n] = act(Σ_k normed[r,k]·W[n,k]) with W [N, D] and act relu² or none, in one launch: the same
// values as residual_norm and then linear_relu_square / linear_rows. 1 ≤ rows ≤ kGemvRows and
// rows·D ≤ kFusedRowElems (the normed rows are kept in shared memory, as dt, by every block).
constexpr int64_t kFusedRowElems = 12000;  // ≤ 47 KB of rows (fp32 at most): within the 48 KB a block takes without opting in
void residual_norm_linear(Dtype dt, const ResidualNormArgs& p, const void* W, void* y, int64_t N, bool relu_square,
                          cudaStream_t stream);
// The same GEMV without the activation: y[r, n] = Σ_k x[r,k]·W[n,k] in one launch (cuBLAS may
// split a one-row product with a long K, such as the MLP's down projection, into a GEMM and a
// reduction kernel).
void linear_rows(Dtype dt, const void* x, const void* W, void* y, int rows, int64_t N, int64_t K, cudaStream_t stream);

// out = cap·tanh(l/cap) in fp32 over n logits of dtype dt; `advance` (int64, one element on the
// device, or null) is incremented by one in the same launch.
void softcap(Dtype dt, const void* logits, float* out, int64_t n, float cap, int64_t* advance, cudaStream_t stream);

// The greedy token of each of `rows` rows of V logits (contiguous, dtype dt): at::argmax's index
// (NaN above every number, the first among equals) as int64 into out[rows], in one launch of
// greedy_blocks_per_row(V) blocks per row whose last block merges the row's partials. Workspace:
// ws_v and ws_i of rows · greedy_blocks_per_row(V) elements; counters: `rows` zeroed unsigned, left
// zero by each launch.
constexpr int kGreedyMaxBlocks = 128;
int greedy_blocks_per_row(int64_t V);
void greedy_tokens(Dtype dt, const void* logits, int64_t rows, int64_t V, int64_t* out, float* ws_v, int64_t* ws_i,
                   unsigned* counters, cudaStream_t stream);

}  // namespace mixbench::decode_cuda_ops
