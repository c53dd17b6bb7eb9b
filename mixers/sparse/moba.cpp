// Method `moba`: nanochat's attention layer (as dense_full: projections, VE gate, RoPE, QK-norm,
// ×1.2, c_proj) whose attention is MoBA (MoonshotAI/MoBA, moba_naive):
//   k̄_i   = mean of the keys in block i (block = moba_block tokens; the partial last block
//           averages what it holds), per KV head;
//   s_t,i = q_t·k̄_i per query head, in fp32 (fp64 for fp64 inputs), no 1/√d;
//   blocks after the query's block are excluded, the query's own block is always chosen and
//   counts toward the moba_topk blocks (seed 001: block 128, budget 256 tokens = 2 blocks);
//   attention (scale dh^-½) over the chosen blocks' keys, token-causal inside the own block.
// Ties between gate scores go to the lower block (op block_topk, own block counted). The selection carries no
// gradient and MoBA adds no parameters. With GQA each query head selects its own blocks
// (the KV heads are expanded to the query heads before the block-sparse op).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>


#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/nvtx.h"
#include "mixers/common/layers.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/sparse_decode.h"
#include "mixers/sparse/sparse_method.h"
#include "reference/sparse.h"

namespace mixbench {

namespace {

using namespace sparse_layer;

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx&, reference::LayerSelection& sel) {
  Dims d = dims(c);
  return {{"y", reference::moba_layer(in.at("x"), in.get_or("ve", at::Tensor()), attention_weights(in), d.H, d.Hkv,
                                      d.dh, c.f("rope_base"), c.i("moba_block"), c.i("moba_topk"), &sel)}};
}

// Block indices [B,H,T,nsel] of the MoBA gate (no gradient), nsel = min(topk, #blocks): the gate
// scores s_t,i = q_t·k̄_i of every block, selected by block_topk_fast with the own block counted.
at::Tensor moba_select(const at::Tensor& q, const at::Tensor& k, int64_t bs, int64_t topk) {
  c10::NoGradGuard ng;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dh = q.size(3), Hkv = k.size(2), G = H / Hkv;
  const int64_t NB = (T + bs - 1) / bs;
  at::Tensor qf = layers::is_half(q) ? layers::f32(q) : q;
  at::Tensor kf = layers::is_half(k) ? layers::f32(k) : k;
  // Block means: sum of the (zero-padded) block over its real length.
  at::Tensor kp = at::constant_pad_nd(kf, {0, 0, 0, 0, 0, NB * bs - T});
  at::Tensor len = (T - at::arange(NB, kf.options()) * bs).clamp_max(double(bs)).view({1, NB, 1, 1});
  at::Tensor kbar = kp.reshape({B, NB, bs, Hkv, dh}).sum(2) / len;              // [B,NB,Hkv,dh]
  at::Tensor kh = kbar.permute({0, 2, 3, 1});                                // [B,Hkv,dh,NB]
  at::Tensor qh = qf.reshape({B, T, Hkv, G, dh}).permute({0, 2, 1, 3, 4}).reshape({B, Hkv, T * G, dh});
  at::Tensor s = at::matmul(qh, kh).view({B, Hkv, T, G, NB}).permute({0, 1, 3, 2, 4}).reshape({B, H, T, NB});
  return select_blocks(s, bs, topk, /*own_counted=*/true);
}

// The same code on every backend: the *_fast entry points pick the device's kernels.
TensorMap forward(const TensorMap& in, const Config& c, const LayerCtx&, Backend) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), G = d.H / d.Hkv, bs = c.i("moba_block");
  QKV a = qkv(in, c);
  at::Tensor idx = moba_select(a.q, a.k, bs, c.i("moba_topk"));  // [B,H,T,n]
  at::Tensor k = G > 1 ? a.k.repeat_interleave(G, 2) : a.k;  // per-query-head selections
  at::Tensor v = G > 1 ? a.v.repeat_interleave(G, 2) : a.v;
  at::Tensor o;
  {
    NvtxRange r(op_range("block_sparse_attention"));
    o = block_sparse_attention_fast(a.q, k, v, idx, bs, /*q_block=*/1, 1.0 / std::sqrt(double(d.dh)));
  }
  return {{"y", at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"))}, {"selection", idx}};
}

// Decode cache (sparse_decode.h): "k", "v" [B,L,Hkv,dh] and the block means "kbar" [B,NB,Hkv,dh]
// (fp32 for half-precision layers, as the gate computes them). A token's own block is always
// chosen, so only the means of complete blocks are ever read: prefill stores those; each decode step
// recomputes its own block's mean from the cached keys (final when the block's last key is in).
TensorMap prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), bs = c.i("moba_block"), NC = T / bs;
  at::Tensor y = forward(in, c, ctx, b).at("y");
  c10::NoGradGuard ng;
  const auto [a, rows] = sparse_decode::prefill_kv(in, cache, c);
  at::Tensor kf = layers::is_half(a.k) ? layers::f32(a.k) : a.k;
  at::Tensor kbar = kf.narrow(1, 0, NC * bs).reshape({B, NC, bs, d.Hkv, d.dh}).sum(2) / double(bs);
  sparse_decode::store(cache, "kbar", kbar, sparse_decode::prefill_block_rows(cache, T, bs));
  return {{"y", y}};
}

// One token at the cache's position p: its gate scores against the block means up to its own block,
// block_topk_own with the own block p / bs counted, attention over the chosen blocks' keys ≤ p.
TensorMap decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend) {
  c10::NoGradGuard ng;
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const sparse_decode::Step st = sparse_decode::begin_step(cache, x);
  const int64_t B = x.size(0), G = d.H / d.Hkv, bs = c.i("moba_block"), NB = st.block_rows(bs);
  QKV a = sparse_decode::qkv_at(in, c, st.pos);
  sparse_decode::put(cache, "k", a.k, st.pos, st.rows);
  sparse_decode::put(cache, "v", a.v, st.pos, st.rows);
  const at::Tensor& K = cache.at("k");
  const at::Tensor& V = cache.at("v");
  const at::Tensor cur = at::div(st.pos, bs, "floor");
  at::Tensor own = sparse_decode::block_rows_of(K, cur, bs);
  if (layers::is_half(own)) own = layers::f32(own);
  sparse_decode::put(cache, "kbar", own.sum(1, /*keepdim=*/true) / double(bs), cur, NB);
  const at::Tensor& kbar = cache.at("kbar");  // [B,NB,Hkv,dh]
  at::Tensor qf = layers::is_half(a.q) ? layers::f32(a.q) : a.q;
  // the gate against the block means up to the own block (sparse_decode::row_scores: 0 past it)
  at::Tensor s = sparse_decode::row_scores(qf.view({B, d.Hkv, G, d.dh}), kbar, st.pos, bs).view({B, d.H, 1, NB});
  at::Tensor sel;
  {
    NvtxRange r(op_range("block_topk"));
    sel = block_topk_own(s, cur, c.i("moba_topk"), /*counted=*/true).squeeze(2);  // [B,H,n]
  }
  const sparse_decode::Keys keys = sparse_decode::block_keys(sel, bs, st.pos);
  at::Tensor o = sparse_decode::attend_keys(a.q.view({B, d.H, d.dh}), K, V, keys.keys, keys.valid, 1.0 / std::sqrt(double(d.dh)));
  sparse_decode::end_step(cache, st);
  return {{"y", at::linear(o.view({B, 1, d.H * d.dh}), in.at("c_proj"))}};
}

// Per token at length T, NB = ceil(T/bs), n = min(topk, NB) selected block slots:
//   fwd = 2·N_l + 2·H·dh·NB (gate q·k̄ against every block) + Hkv·dh·NB·bs/T (block means)
//         + 4·H·dh·n·bs (the block-sparse op computes every slot of every selected block,
//           the masked future part of the own block and empty slots included)
//   block means: the keys summed per block, zero-padded to NB·bs rows (bs − 1 additions per mean
//     element), then one division: bs FLOPs per mean element, NB·bs·Hkv·dh per sequence (qsa's
//     convention for its pooled keys); element-wise, so the FlopCounter cannot see them: uncounted
//   nanochat training core term = 12·H·dh·min(n·bs, T) + 2·H·dh·NB (the gate and the block means
//     have no backward; the means are element-wise, outside nanochat's matmul convention)
//   decode at context c (position c − 1), NBc = ceil(c/bs), nc = min(topk, NBc):
//     2·N_l + Hkv·dh·bs (the own block's mean recomputed from its bs cached key rows)
//     + 2·H·dh·NBc (gate against the block means up to the own block)
//     + 4·H·dh·nc·bs (every slot of the selected blocks gathered and computed)
//   KV cache as dense attention: 2·Hkv·dh elements per token (block means are recomputable); a
//     decode step reads Hkv·dh·(bs + NBc + 2·min(nc·bs, c)) of them and of the means (its own
//     block's keys, the means, the selected blocks' K and V)
LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  Dims d = dims(c);
  const int64_t bs = c.i("moba_block"), topk = c.i("moba_topk");
  const int64_t NB = (q.T + bs - 1) / bs, n = std::min(topk, NB);
  const int64_t NBc = (q.context + bs - 1) / bs, nc = std::min(topk, NBc);
  LayerCost lc;
  const int64_t N = attention_matmul_params(c, ctx);
  lc.params.transformer_matrices = N;
  lc.params.matmul = N;
  const double hd = double(d.H * d.dh), kd = double(d.Hkv * d.dh);
  lc.uncounted_flops = kd * double(NB * bs) / double(q.T);
  lc.fwd_flops = 2.0 * double(N) + 2.0 * hd * double(NB) + lc.uncounted_flops + 4.0 * hd * double(n * bs);
  lc.nanochat_core_flops = 12.0 * hd * double(std::min(n * bs, q.T)) + 2.0 * hd * double(NB);
  lc.decode_flops = 2.0 * double(N) + kd * double(bs) + 2.0 * hd * double(NBc) + 4.0 * hd * double(nc * bs);
  lc.cache_bytes_per_token = 2.0 * double(d.Hkv * d.dh) * double(q.dtype_bytes);
  lc.decode_read_bytes = double(d.Hkv * d.dh) *
                         double(bs + NBc + 2 * std::min(nc * bs, q.context)) * double(q.dtype_bytes);
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + 2 * d.H * d.dh + 4 * d.Hkv * d.dh + d.H * d.dh) + 4.0 * double(d.H);
  lc.formula = fmt::format("MoBA block {} top-{} blocks: fwd 2N + 2·H·dh·ceil(T/{}) + Hkv·dh·ceil(T/{})·{}/T (block means) "
                           "+ 4·H·dh·{}·{}",
                           bs, topk, bs, bs, bs, n, bs);
  return lc;
}

std::vector<CaseDef> cases(const ConfigSpec& spec) {
  // A 4-layer model, d=64, 4 heads of 16; blocks of 8 tokens, 2 blocks (budget 16 tokens).
  Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,moba_block=8,moba_topk=2");
  return {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_T13_all_selected", base, 2, 13, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T45", base, 2, 45, 1},
      {"layer3_last_ve_gqa_T29", base.with("kv_ratio", int64_t(2)), 1, 29, 3},
      {"layer2_mqa_T33", base.with("kv_ratio", int64_t(0)), 1, 33, 2},
      {"layer2_top3_block5_T70", base.with("moba_topk", int64_t(3)).with("moba_block", int64_t(5)), 1, 70, 2},
  };
}

MethodSpec make_spec() {
  SparseMethodDesc d;
  d.name = "moba";
  d.summary = "MoBA: per-head top-k key blocks by q·mean(K_block), own block forced and counted (block 128, 2 blocks)";
  d.citation = "MoonshotAI/MoBA moba_naive (arXiv 2502.13189); nanochat attention layer";
  d.knobs = [](ConfigSpec& s) {
    s.i("moba_block", 128, "tokens per key block", 1)
        .i("moba_topk", 2, "blocks per query and head, the own block included (budget = topk·block tokens)", 1);
  };
  d.ops = {"block_topk", "block_sparse_attention"};
  d.params = attention_params;
  d.reference = reference_fn;
  d.forward = forward;
  d.account = account;
  d.cases = cases;
  d.prefill = prefill;
  d.decode = decode;
  MethodSpec m = sparse_method(d);
  // Training preset tiny: the default block (128) would be the whole sequence: 4 blocks of 32, 2 per
  // query.
  m.presets["tiny"].config = "moba_block=32,moba_topk=2";
  // gpu-d12: with no CUDA kernel, the LibTorch path's gathered keys for 32 rows × 2048 tokens need
  // more than an H200's memory; micro-batches of 2 rows.
  m.presets["gpu-d12"].micro_batch = 2;
  return m;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
