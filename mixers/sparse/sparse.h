// Optimized paths of the sparse-attention family's ops (LibTorch, gather-based).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "harness/registry.h"

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

// q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv], block_indices [B,Hkv,ceil(T/q_block),topk] int64
// (−1 = empty slot) -> o [B,T,H,Dv]: query t attends to the keys s ≤ t of the blocks (of
// block_size keys) listed in its query row t / q_block, through KV head h / (H/Hkv).
at::Tensor block_sparse_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& block_indices, int64_t block_size, int64_t q_block,
                                      double scale);

// Op block_topk (block_topk_op.cpp): scores [B,S,T,N] -> block_indices [B,S,T,K]; counted = the own
// block t / bs forced and counted among topk (moba), else appended after the min(topk, N) best
// complete history blocks (nsa, seer, qsa). Descending score, ties to the lower block, −1 padded.
at::Tensor block_topk_cpu(const at::Tensor& scores, int64_t block_size, int64_t topk, bool counted);

// CUDA path of the sparse ops: the same device-agnostic LibTorch code, with bf16 / fp16 inputs
// computed in fp32 (cast back on the way out). Top-k selections and gathered sums in half precision
// would flip near-tied keys and round the index_add accumulations.
TensorMap run_in_fp32(const OpFn& fn, const TensorMap& in, const Config& p);

// The layers' entry points: the same contracts as the functions above, without the ops' value checks
// and without host synchronisation, for inputs that are valid by construction (selections made by
// block_topk / dsa_indexer), so that a captured CUDA graph can hold them. They run the dedicated
// CUDA kernels where one exists for the device, dtype and shape; otherwise the LibTorch code above
// (half-precision inputs computed in fp32, the outputs cast back). Attention outputs are
// differentiable in q, k, v; selections carry no gradient.
at::Tensor block_sparse_attention_fast(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& block_indices, int64_t block_size, int64_t q_block,
                                       double scale);
at::Tensor sparse_attention_fast(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& indices, double scale);

// The CUDA kernels behind block_sparse_attention_fast (same contract), chosen: Auto (what the fast
// path runs) = TensorCores where they apply (bf16 / fp16, D = Dv ∈ {64, 128}, q_block 1, block_size
// ≥ 16; block_sparse_mma.cu), else CudaCores (fp32 / bf16 / fp16, D = Dv ∈ {64, 128};
// block_sparse_kernel.cu). UsageError when the chosen kernels cannot take the inputs or without CUDA.
enum class BlockSparseKernels { Auto, CudaCores, TensorCores };
at::Tensor block_sparse_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& block_indices, int64_t block_size, int64_t q_block,
                                       double scale, BlockSparseKernels which);
// On this thread while it lives: block_sparse_attention_fast runs `which` in place of Auto where the
// CUDA kernels apply (TensorCores only where they apply, else CudaCores). For tests and benchmarks.
class ScopedBlockSparseKernels {
 public:
  explicit ScopedBlockSparseKernels(BlockSparseKernels which);
  ~ScopedBlockSparseKernels();
  ScopedBlockSparseKernels(const ScopedBlockSparseKernels&) = delete;
  ScopedBlockSparseKernels& operator=(const ScopedBlockSparseKernels&) = delete;

 private:
  BlockSparseKernels prev_;
};
at::Tensor dsa_indexer_fast(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx, int64_t topk,
                            double scale, bool relu);
at::Tensor block_topk_fast(const at::Tensor& scores, int64_t block_size, int64_t topk, bool counted);
// block_topk_fast's selection for query rows whose own blocks are given, own [T] (int64, on the
// scores' device), instead of t / block_size: a decoded token at a position held on the device.
// scores [B,S,T,N] -> [B,S,T,K], K as block_topk's for N scored blocks. No host synchronisation.
at::Tensor block_topk_own(const at::Tensor& scores, const at::Tensor& own, int64_t topk, bool counted);
// The indexer's top-k through topk_lowest_index, one block of queries at a time (fp32 inputs; the
// score block stays within about `budget_bytes`, see dsa_indexer_block): dsa_indexer_fast's path for
// every input that is not fp64, on any device. The same contract as dsa_indexer_cpu.
at::Tensor dsa_indexer_topk(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx, int64_t topk,
                            double scale, bool relu, int64_t budget_bytes = int64_t(256) << 20);
// Queries per block of dsa_indexer_topk: the most (1 … min(T, kDsaIndexerQueryBlock)) whose per-block
// tensors — similarities [B,n,H_I,T] fp32, scores, int64 keys and the top-k's work space, about
// B·n·T·(4·H_I + 40) bytes — fit in budget_bytes. The cap keeps the causal waste small (each block
// scores every key up to its last query): the accountant bills blocks of kDsaIndexerQueryBlock.
inline constexpr int64_t kDsaIndexerQueryBlock = 256;
int64_t dsa_indexer_block(int64_t B, int64_t T, int64_t HI, int64_t budget_bytes);
// DSA's KL target: per query, the attention's probabilities over its selected keys averaged over the
// heads. q [B,T,H,dh], k [B,T,Hkv,dh] (H a multiple of Hkv), idx [B,T,K] (−1: an empty slot; keys ≤
// the query's position) -> [B,T,K] (fp32 for half inputs), 0 on empty slots; no gradient. Formed by
// blocks of queries whose work space stays within about `budget_bytes`: the scores in the inputs'
// dtype, the softmax in fp32 for half inputs. Two forms of the scores, the same values (DsaScoreForm):
//   Gathered     each query's selected keys copied out ([n,K,Hkv,dh] a block) and multiplied;
//   DenseScores  the block's queries against every key up to the block's last (one GEMM, [H,n,≤T]
//                scores), the selected columns then gathered from them;
//   Auto         DenseScores where a query's row of scores (H·T values) is under a quarter of its
//                gathered keys (K·Hkv·dh values), dsa_dense_target: short contexts, where copying K
//                keys per query moves many times the cache.
// The dense form scores every key (not only those up to a block's last query), so that its work per
// token, H·dh·T, does not depend on the blocks: what the accountant bills.
enum class DsaScoreForm { Auto, Gathered, DenseScores };
bool dsa_dense_target(int64_t T, int64_t H, int64_t Hkv, int64_t dh, int64_t K);
// The student side's rule: H_I·T < K·d_I.
bool dsa_dense_student(int64_t T, int64_t HI, int64_t DI, int64_t K);
at::Tensor dsa_selected_attention_mean(const at::Tensor& q, const at::Tensor& k, const at::Tensor& idx, double scale,
                                       int64_t budget_bytes = int64_t(256) << 20,
                                       DsaScoreForm form = DsaScoreForm::Auto);
// DSA's KL student side per token, KL(p_t ‖ softmax over the selection of I_{t,·}) [B,T], with
// I_{t,j} = Σ_h wi_{t,h}·ReLU(qi_{t,h}·ki_{idx_{t,j}}): qi [B,T,H_I,d_I], ki [B,T,d_I], wi [B,T,H_I] (their
// gradients flow), idx [B,T,K] (−1: an empty slot), p [B,T,K] (the target, no gradient, 0 on empty
// slots), all one floating dtype. Blocks of queries whose gathered keys and scores stay within about
// `budget_bytes`, in the forward and again in the backward: nothing per key is kept between them.
// The forms as dsa_selected_attention_mean's: the selected keys gathered per query, or the block's
// scores against every visible key and the selected columns (the backward scattering the columns'
// gradients into the block's rows of scores); Auto takes the second where a query's row of scores
// (H_I·T values) is under a quarter of its gathered keys (K·d_I): dsa_dense_student.
at::Tensor dsa_student_kl(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& wi, const at::Tensor& idx,
                          const at::Tensor& p, int64_t budget_bytes = int64_t(256) << 20,
                          DsaScoreForm form = DsaScoreForm::Auto);
// block_topk_cpu's contract through topk_lowest_index (fp32 scores; others: block_topk_cpu).
at::Tensor block_topk_keys(const at::Tensor& scores, int64_t block_size, int64_t topk, bool counted);

// Indices [..., k] of the k largest fp32 scores along the last dim, in descending score order, ties
// to the lower index: exactly the first k columns of a stable descending sort (−0.0 equal to +0.0;
// no NaN), through at::topk on int64 keys (score order, then index) instead of a sort of the row.
// No host synchronisation. Defined in topk_lowest.cpp.
at::Tensor topk_lowest_index(const at::Tensor& scores, int64_t k);

// x in fp32 when it is bf16 / fp16, else x itself.
at::Tensor up_to_fp32(const at::Tensor& x);

// Invariant of the sparse ops: with every causal key (or block) selected (`full`: the op's inputs,
// `pf`: its params), the op's FP64 reference and its optimized path (inputs in dtype dt) equal dense
// causal attention (the attention op's reference) with the same scale. Defined in sparse_attention_op.cpp.
std::vector<std::pair<std::string, double>> dense_equivalence_of(const std::string& op, const TensorMap& full,
                                                                 const Config& pf, double scale, Backend b,
                                                                 at::ScalarType dt);

// Every key s ≤ t selected, −1 elsewhere: [B,T,T] int64 on `like`'s device.
at::Tensor causal_full_indices(int64_t B, int64_t T, const at::Tensor& like);

}  // namespace mixbench
