// Incremental decoding of the sparse-attention layers (moba, dsa, qsa, nsa, seer): the pieces their
// prefill / decode hooks share. A layer's cache holds per-token buffers ("k", "v" [B,L,Hkv,dh], the
// indexer keys of dsa) and per-block buffers (block means, compressed keys and values, pooled
// indexer / gate keys [B,NB,...]) plus, where a block's summary is pooled from values the layer does
// not keep, a ring of the last `block` tokens' values. One decode step code serves both kinds of
// cache (MethodSpec::static_decode):
//   eager (the CPU path): the buffers hold exactly the tokens seen (L = pos + 1 after the step's
//     write, NB = pos / block + 1), the position is the cache's host "pos";
//   static: the buffers are allocated once for the cache's capacity (L = capacity, NB =
//     ceil(capacity / block)) and written in place; the position is read on the device only.
// Every step masks what lies past the position (keys > pos, blocks that are no candidate of the
// token's block), so the two give the same selection and output. Its products over the head
// dimension against the buffers (the gate, indexer and compressed-attention scores, nsa's mix of the
// compressed values) stop at the position (row_scores, row_mix below): on a GPU their kernels read
// the device position, so a captured step's work follows the position, not the capacity. What stays
// O(capacity) per step: the selection over the scores of the whole buffer (the block top-k over
// ceil(capacity / block) blocks, dsa's top-k over the capacity's keys), the masks and element-wise
// work on score rows (nsa's softmax, qsa's ReLU and head sum), and the output rows written past the
// position — no product over the head dimension; these shapes are fixed by the capture, and a
// capture knows no position, so only a host-side bound per captured graph (graphs per capacity
// bucket) could shrink them.
// A block's summary is recomputed at every step of the token's own block from the block's keys
// (the buffer rows, or the ring): the value left when the block completes is the forward's, and a
// block becomes a candidate only after it completes.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "harness/registry.h"
#include "mixers/sparse/sparse_method.h"

namespace mixbench::sparse_decode {

// Where one decode step writes and what it reads.
struct Step {
  at::Tensor pos;        // int64 [1] on the layer's device: the decoded token's position
  int64_t rows = 0;      // per-token buffer rows after the step's write: the capacity, or pos + 1
  bool is_static = false;
  int64_t block_rows(int64_t block) const { return (rows - 1) / block + 1; }  // rows of a per-block buffer
};
// The step of decoding x [B,1,d] with `cache` (InputError for another shape).
Step begin_step(const TensorMap& cache, const at::Tensor& x);
// After the step: an eager cache advances its host position (a static one's advances on the device).
void end_step(TensorMap& cache, const Step& st);

// Prefill: empties an eager cache (a static one keeps its buffers), records the T tokens and
// returns the per-token rows of its buffers: T (eager) or the capacity (static; InputError when T
// does not leave room for a decoded token).
int64_t begin_prefill(TensorMap& cache, int64_t T);
// Per-block rows of a prefilled cache of T tokens: the complete blocks T / block (eager; the
// token's block is added by its first decode step) or ceil(capacity / block) (static).
int64_t prefill_block_rows(const TensorMap& cache, int64_t T, int64_t block);
// Buffer `name` of `rows` rows along dim 1 holding t [B,n,...] in its first n rows: eager: t itself
// (n = rows); static: a zero buffer allocated once (kept by later prefills of the same shape).
void store(TensorMap& cache, const std::string& name, const at::Tensor& t, int64_t rows);
// A ring of `block` rows holding the tokens of the unfinished block: t [B,n,...] are positions
// T − n … T − 1 of a prefill of T tokens, T − n a multiple of block (slot = position mod block).
void store_ring(TensorMap& cache, const std::string& name, const at::Tensor& t, int64_t block);
// Writes row [B,1,...] at row `at` (int64 [1], on the device) of buffer `name`; an eager buffer
// first grows (zero rows) to `rows` rows.
void put(TensorMap& cache, const std::string& name, const at::Tensor& row, const at::Tensor& at, int64_t rows);

// Every sparse layer's prefill starts alike: begin_prefill(cache, T), the layer's q/k/v of the T
// tokens, and k and v stored in "k", "v" [B,rows,Hkv,dh]. Returns the q/k/v and the rows.
struct PrefillKV {
  sparse_layer::QKV a;
  int64_t rows;
};
PrefillKV prefill_kv(const TensorMap& in, TensorMap& cache, const Config& c);

// The layer's q [B,1,H,dh], k and v [B,1,Hkv,dh] (and k_raw) of the decoded token at position
// `pos` (int64 [1] on the device): sparse_layer::qkv's values at that position.
sparse_layer::QKV qkv_at(const TensorMap& in, const Config& c, const at::Tensor& pos);

// The rows of block `blk` (int64 [1]) of a per-token buffer [B,L,...]: [B,block,...], rows past L
// repeat row L − 1 (the unfinished block of an eager cache; no selection reads them).
at::Tensor block_rows_of(const at::Tensor& buf, const at::Tensor& blk, int64_t block);
// Keys of the selected blocks sel [B,S,n] (−1 = empty slot): keys [B,S,n·block] and whether each is
// attended (the block selected, the key ≤ pos).
struct Keys {
  at::Tensor keys, valid;
};
Keys block_keys(const at::Tensor& sel, int64_t block, const at::Tensor& pos);
// One query per row attending to selected keys of the buffers: q [B,H,dh], K and V [B,L,Hkv,dh],
// keys [B,S,n] (S = 1: shared by all heads; Hkv: per KV head; H: per query head, KV head h / (H/Hkv))
// with `valid` [B,S,n] (at least one key valid per row) -> o [B,H,dh]. Softmax over the valid keys,
// in fp32 for half-precision inputs (cast back). On a GPU, for S = 1 or Hkv, one launch of the
// split-KV kernel over the listed slots (attention_decode_listed); otherwise LibTorch gathers.
at::Tensor attend_keys(const at::Tensor& q, const at::Tensor& K, const at::Tensor& V, const at::Tensor& keys,
                       const at::Tensor& valid, double scale);

// The rows of a decode buffer [B,L,...] that a token at position pos (int64 [1]) reaches: j ≤ pos /
// per, per = 1 for a per-token buffer, the block size for a per-block one (the token's own block
// the last). The products below compute these rows only and give 0 for the others: on a GPU one
// kernel launch each that reads the position on the device (mixers/sparse/decode_rows_kernel.h:
// the step stays capturable and its work follows the position, not the capacity); on the CPU the
// position is read on the host (no synchronisation there) and the products run over the first
// rows; elsewhere (fp64 on a GPU) the whole buffer's product masked (row_scores_masked).
// Selections never read a row past the position, so each layer's results are those of the whole
// buffer's products; a static cache's step no longer scales with its capacity (but for the
// O(capacity) selection and masks that follow, which are not products over the head dimension).
//
// Scores: q [B,S,G,D], K [B,L,S,D] (K converted to q's dtype) -> [B,S,G,L], the product over D for
// the reached rows. With w [B,S,G]: Σ_g w[b,s,g]·relu(score) -> [B,S,L] (dsa's head-weighted indexer).
at::Tensor row_scores(const at::Tensor& q, const at::Tensor& K, const at::Tensor& pos, int64_t per,
                      const at::Tensor& w = at::Tensor());
// Mix: p [B,S,G,L], V [B,L,S,D] -> [B,S,G,D] = Σ_j p[..,j]·V[b,j,s] over the reached rows (p
// converted to V's dtype first).
at::Tensor row_mix(const at::Tensor& p, const at::Tensor& V, const at::Tensor& pos, int64_t per);
// The device-side definitions (whole buffers, rows past the reach masked to 0 before and after the
// product): the path of a GPU without the kernels' dtypes, and what the others are checked against.
at::Tensor row_scores_masked(const at::Tensor& q, const at::Tensor& K, const at::Tensor& pos, int64_t per,
                             const at::Tensor& w = at::Tensor());
at::Tensor row_mix_masked(const at::Tensor& p, const at::Tensor& V, const at::Tensor& pos, int64_t per);

}  // namespace mixbench::sparse_decode
