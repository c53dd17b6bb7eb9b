// Block Attention Residuals (arXiv 2603.15031; MoonshotAI/Attention-Residuals): the residual
// stream of method `attnres`. Depth is counted in sublayers (an attention and an MLP sublayer per
// layer, j = 0 … J−1, J = 2·plan steps). Before sublayer j the stream returns
//   h_j = Σ_n softmax_n(w_j · RMSNorm(v_n)) · v_n
// over the sources v = [embedding, completed block sums, the current block's partial sum], with
// w_j ∈ R^d a zero-initialised pseudo-query and a parameter-free RMSNorm on the keys; the sublayer's
// output is added to the partial sum. A block boundary falls before every sublayer j with
// j mod S = 0: the sublayer still reads the partial sum (the block just completed), then the
// partial joins the sources and restarts from zero. At j = 0 the only source is the embedding, so
// the first sublayer reads it unchanged and the embedding becomes source b₀. The final read-out
// mixes the same sources with its own pseudo-query (w_J).
//
// Grouping rule: S = 2·⌈L/8⌉ sublayers (blocks of ⌈L/8⌉ whole layers, about 8 blocks), counted from
// the first sublayer; the last block takes the remainder. At seed 001's 23 layers: blocks of 3
// layers, 3,3,3,3,3,3,3,2. The config field `attnres_block` sets S directly (any S from 1 to J).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "harness/residual.h"

namespace mixbench {

// Sublayers per block: `block` when positive, else the rule 2·⌈n_layer/8⌉.
int64_t attnres_block_size(int64_t n_layer, int64_t block);

// Sizes (in sublayers) of the blocks a depth of `n_sublayers` splits into with block size S:
// S, …, S, then the remainder. InputError when S < 1 or S > n_sublayers (no whole block fits).
std::vector<int64_t> attnres_groups(int64_t n_sublayers, int64_t block_size);

// Sources the mix before sublayer j sees (j = n_sublayers: the final read-out): 1 + ⌈j/S⌉.
int64_t attnres_sources(int64_t j, int64_t block_size);

// Test hook proving the conformance checks catch a wrong fast path: the fast path (never the
// reference) skips the keys' RMSNorm, or keeps the partial sum at a block boundary.
enum class AttnResFault { None, KeysNotNormalised, NoReset };

// The stream with S sublayers per block. Its parameter "attnres_queries" [J + 1, d] holds one
// pseudo-query per sublayer and the final read-out's as the last row (zero init, AdamW group
// "attnres_queries" without weight decay).
std::shared_ptr<const ResidualStream> attnres_stream(int64_t block_size, AttnResFault fault = AttnResFault::None);

// The fast path's depth mix: sources V [..., N, d] stacked along dim −2, pseudo-query w [d] ->
// Σ_n softmax_n(w · RMSNorm(v_n)) · v_n [..., d] (scores and softmax in at least FP32).
at::Tensor attnres_mix(const at::Tensor& V, const at::Tensor& w, bool normalise_keys = true);

}  // namespace mixbench
