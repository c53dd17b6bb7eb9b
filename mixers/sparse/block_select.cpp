// Methods `qsa`, `nsa` and `seer`: nanochat's attention layer (as dense_full: projections, VE gate,
// RoPE, QK-norm, ×1.2, c_proj) whose attention reads whole key blocks chosen per query token.
// All three share one selection rule shape (seed 001: "select complete blocks plus the unfinished
// tail block"): the candidates of query t are the complete blocks i < t / block (every key of
// such a block is ≤ t); the `*_topk` best candidates by the method's score are attended (op
// block_topk, own block appended: ties go to the lower block; fewer candidates than topk leave −1
// slots), plus the query's own block,
// token-causal (its unfinished tail). The defaults select 256 history tokens (seed 001). When
// T ≤ (topk + 1)·block every causal key is attended and the selection equals dense attention.
// The attention over the selected blocks is op block_sparse_attention (q_block 1: one selection
// per query token). Selections carry no gradient.
//
// qsa (Qwen report §2.1.2, as seed 001 adapts it): an indexer on the detached layer input h,
//   q^I_{t,j} = (W^I_q h_t)_j, H_I heads of d_I, partial NeoX RoPE at position t;
//   k^I_{i,m}  = RoPE(RMSNorm(mean over the qsa_block keys of block i of (W^I_k h_s)_m)) at the
//                block's first position, H_I / qsa_group key heads (qsa_group query heads share one);
//   I_{t,i}   = Σ_j ReLU(q^I_{t,j}·k^I_{i,j/qsa_group} / √d_I)   (sum over all indexer heads).
//   Teacher: the main attention probabilities over the attended keys (q, k detached), averaged over
//   heads, max-pooled over each block; auxiliary loss KL(teacher ‖ softmax(I_t)) with both sides
//   renormalised over the selected complete blocks, mean over the B·T tokens (a token without a
//   selected complete block adds 0). For a bf16/fp16 layer the indexer (projections, pooling,
//   RMSNorm, RoPE, student scores, KL) runs in fp32 from the half-precision input and weights
//   (indexer_precision, sparse_method.h); the selection's block scores in the compute dtype.
// nsa (arXiv 2502.11089 §3.2–3.3, seed 001 sizes): three branches mixed by per-head sigmoid gates
//   g = σ(W_g x) ∈ [0,1]^{3H} (W_g: d → 3·H, order [cmp, slc, win] × heads):
//   compression: K̃_i = W_ck·vec(k_{block i}), Ṽ_i = W_cv·vec(v_{block i}) per KV head
//     (non-overlapping blocks of nsa_block tokens; a linear map block·dh → dh stands for the
//     paper's MLP φ, its position-specific weights acting as the intra-block position encoding —
//     an added encoding would only shift every compressed key alike); query t attends (scale dh^-½) to
//     the complete blocks (i+1)·block − 1 ≤ t; a query with none gets 0 from this branch;
//   selection: block score = compressed-attention probability summed over the query heads of the
//     KV group (selection blocks = compression blocks, so no overlap remapping); top nsa_topk
//     history blocks plus the own block, per KV head;
//   window: the last nsa_window keys (op attention with a window).
//   NSA is trained end to end: no auxiliary loss.
// seer (SeerAttention's AttnGate, microsoft/SeerAttention seer_attn/attn_gate.py, adapted by seed
//   001: token queries, trained from scratch):
//   K̃_{i,h'} = RoPE_{i·block}(W^G_k[h']·[max; min; mean over block i of k⁰_{h'}]) (per KV head,
//     3·dh → d_g), as the original: the layer's keys before their rotation, k⁰ = 1.2·RMSNorm(c_k x)
//     (nanochat normalises after RoPE; RMSNorm commutes with the rotation, so RoPE(k⁰) is the
//     attention's key), pooled per block, projected, then rotated over all d_g dims with the
//     layer's rotation (half-split, nanochat's sign, base rope_base) at the block's FIRST position
//     i·block — the original's block_position_ids = position_ids[:, 0::block_size];
//   Q̃_{t,h}  = W^G_q[h]·q_{t,h} (per query head, dh → d_g) on the layer's query after its RoPE and
//     QK-norm (seed 001's token queries, not rotated again); S_{t,h,i} = Q̃·K̃ / √d_g. Gate inputs
//     are detached. Each query head selects its own blocks.
//   seer_gate_keys = rotated keeps the earlier gate: pooled keys after the layer's RoPE and QK-norm,
//   no rotation of the pooled keys.
//   Teacher: full causal attention A = softmax(q kᵀ/√dh) (detached), block-max of A over each
//   history block, renormalised over the candidates; auxiliary loss KL(teacher ‖ softmax(S_{t,h})),
//   mean over the B·T·H (token, head) rows (a row without candidates adds 0). The own block is
//   always attended instead of gated: its pooled key would see tokens after t.
// qsa and seer return `aux_loss`; teacher and gate inputs are detached, so it reaches only the
// indexer / gate parameters (seed 001 weights it 1 per layer, summed over layers).
// Full-attention warm-up of qsa and seer (sparse_method.h): during the first full_attention_warmup_steps
// training steps every complete history block is selected (dense causal attention) and the KL
// covers every candidate block.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <limits>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/nvtx.h"
#include "mixers/common/layers.h"
#include "mixers/attention/attention.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/sparse_decode.h"
#include "mixers/sparse/sparse_method.h"
#include "reference/sparse_blocks.h"

namespace mixbench {
namespace {

using namespace sparse_layer;

constexpr double kMaskedLogit = -1e30;  // finite: rows without candidates stay NaN-free

// NeoX rotation by +θ on the first R dims of x [B,N,…,D], position of row n = pos[n].
at::Tensor rope_neox_at(const at::Tensor& x, const at::Tensor& pos, int64_t R, double base) {
  if (R == 0) return x;
  const int64_t N = x.size(1), half = R / 2;
  auto o64 = at::TensorOptions().dtype(at::kDouble).device(x.device());
  at::Tensor ang = pos.to(o64).view({N, 1}) * at::pow(base, -at::arange(half, o64) * (2.0 / double(R))).view({1, half});
  std::vector<int64_t> shape(size_t(x.dim()), 1);
  shape[1] = N;
  shape.back() = half;
  at::Tensor cs = ang.cos().to(x.scalar_type()).view(shape), sn = ang.sin().to(x.scalar_type()).view(shape);
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half), rest = x.narrow(-1, R, x.size(-1) - R);
  return at::cat({x1 * cs - x2 * sn, x2 * cs + x1 * sn, rest}, -1);
}

// Causal candidate mask [T,NC]: block i < t / bs.
at::Tensor candidate_mask(int64_t T, int64_t NC, int64_t bs, const at::Device& dev) {
  auto lo = at::TensorOptions().dtype(at::kLong).device(dev);
  return at::arange(NC, lo).view({1, NC}) < at::div(at::arange(T, lo), bs, "floor").view({T, 1});
}

at::Tensor block_attend(const QKV& a, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx, int64_t bs,
                        double scale) {
  NvtxRange r(op_range("block_sparse_attention"));
  return block_sparse_attention_fast(a.q, k, v, idx, bs, /*q_block=*/1, scale);
}

// A decoded token's attention over its selected blocks sel [B,S,n] (the own block among them):
// the keys ≤ pos of each block -> o [B,H,dh].
at::Tensor decode_attend(const QKV& a, const TensorMap& cache, const at::Tensor& sel, int64_t bs, const at::Tensor& pos,
                         double scale) {
  NvtxRange r(op_range("block_sparse_attention"));
  const sparse_decode::Keys keys = sparse_decode::block_keys(sel, bs, pos);
  const int64_t B = a.q.size(0), H = a.q.size(2), dh = a.q.size(3);
  return sparse_decode::attend_keys(a.q.view({B, H, dh}), cache.at("k"), cache.at("v"), keys.keys, keys.valid, scale);
}

// The selection of a decoded token whose own block is `cur` (int64 [1]): block scores [B,S,NB] of
// every block of the buffer, candidates the complete blocks before cur, the own block appended
// -> [B,S,n+1].
at::Tensor decode_select(const at::Tensor& scores, const at::Tensor& cur, int64_t topk) {
  NvtxRange r(op_range("block_topk"));
  return block_topk_own(scores.unsqueeze(2), cur, topk, /*counted=*/false).squeeze(2);
}

// Σ p·(log p − logq) over the last dim where valid; logits of invalid slots are ignored.
at::Tensor kl_rows(const at::Tensor& p, const at::Tensor& logits, const at::Tensor& valid) {
  at::Tensor l = layers::is_half(logits) ? logits.to(at::kFloat) : logits;
  at::Tensor logq = at::log_softmax(l.masked_fill(valid.logical_not(), kMaskedLogit), -1).masked_fill(valid.logical_not(), 0.0);
  at::Tensor pl = p.to(logq.scalar_type());
  return (at::xlogy(pl, pl) - pl * logq).sum(-1);
}

at::Tensor pos_tensor(int64_t n, int64_t step, const at::Device& dev) {
  return at::arange(n, at::TensorOptions().dtype(at::kDouble).device(dev)) * double(step);
}

reference::BlockLayerWeights ref_weights(const TensorMap& in) {
  reference::BlockLayerWeights w;
  for (const char* n : {"c_q", "c_k", "c_v", "c_proj"}) w.t[n] = in.at(n);
  if (in.has("ve_gate")) w.t["ve_gate"] = in.at("ve_gate");
  for (const auto& [n, t] : in)
    if (n.rfind("qsa_", 0) == 0 || n.rfind("nsa_", 0) == 0 || n.rfind("seer_", 0) == 0) w.t[n] = t;
  return w;
}

reference::BlockLayerShape ref_shape(const Config& c) {
  Dims d = dims(c);
  return {d.H, d.Hkv, d.dh, c.f("rope_base")};
}

// Per-token average of (complete-block count)·bs / T: the fraction of tokens in complete blocks.
double complete_frac(int64_t T, int64_t bs) { return double((T / bs) * bs) / double(T); }

// ============================================================================================ QSA

struct QsaDims {
  int64_t HI, DI, g, HK, R, bs, topk;
};
QsaDims qsa_dims(const Config& c) {
  const int64_t HI = c.i("qsa_heads"), g = c.i("qsa_group");
  return {HI, c.i("qsa_dim"), g, HI / g, c.i("qsa_rope_dim"), c.i("qsa_block"), c.i("qsa_topk")};
}

std::vector<ParamDef> qsa_params(const Config& c, const LayerCtx& ctx) {
  Dims d = dims(c);
  QsaDims q = qsa_dims(c);
  const double s = std::sqrt(3.0) / std::sqrt(double(d.D));
  std::vector<ParamDef> p = attention_params(c, ctx);
  p.push_back({"qsa_wq", {q.HI * q.DI, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"qsa_wk", {q.HK * q.DI, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  return p;
}

TensorMap qsa_reference(const TensorMap& in, const Config& c, const LayerCtx&, reference::LayerSelection& sel) {
  QsaDims q = qsa_dims(c);
  reference::BlockOut o = reference::qsa_layer(in.at("x"), in.get_or("ve", at::Tensor()), ref_weights(in), ref_shape(c),
                                               q.HI, q.DI, q.g, q.R, q.bs, q.topk, &sel);
  return {{"y", o.y}, {"aux_loss", o.aux_loss}};
}

// The same code on every backend (the *_fast entry points pick the device's kernels). The indexer's
// selection scores I [B,T,NC] are computed without gradient in query chunks (the per-head scores
// [B,H_I,T,NC] would not fit at long T); the KL's student, which trains the indexer, is recomputed
// with gradient at the selected blocks only ([B,T,n]).
TensorMap qsa_forward(const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend) {
  Dims d = dims(c);
  QsaDims Q = qsa_dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), NC = T / Q.bs;
  const double scale = 1.0 / std::sqrt(double(d.dh)), base = c.f("rope_base"), si = 1.0 / std::sqrt(double(Q.DI));
  QKV a = qkv(in, c);
  // Indexer on the detached input, in fp32 for half inputs (indexer_precision); the selection's
  // block scores in the compute dtype.
  const auto ip = [&x](const at::Tensor& t) { return indexer_precision(t, x); };
  at::Tensor xd = ip(x.detach());
  at::Tensor qi = rope_neox_at(at::linear(xd, ip(in.at("qsa_wq"))).view({B, T, Q.HI, Q.DI}), pos_tensor(T, 1, x.device()), Q.R, base);
  at::Tensor I = at::zeros({B, T, 0}, x.options());
  at::Tensor kb;  // pooled keys [B,NC,HK,DI]
  if (NC > 0) {
    at::Tensor kt = at::linear(xd.narrow(1, 0, NC * Q.bs), ip(in.at("qsa_wk")));          // [B,NC·bs,HK·DI]
    kb = layers::rms_norm(kt.view({B, NC, Q.bs, Q.HK, Q.DI}).mean(2));                     // [B,NC,HK,DI]
    kb = rope_neox_at(kb, pos_tensor(NC, Q.bs, x.device()), Q.R, base);
    c10::NoGradGuard ng;
    at::Tensor kh = kb.detach().to(x.scalar_type()).permute({0, 2, 3, 1});                 // [B,HK,DI,NC]
    at::Tensor qs = qi.detach().to(x.scalar_type());
    // per query row: the per-head scores and their ReLU, fp32
    const int64_t chunk = chunk_rows(2.0 * 4.0 * double(B * Q.HI * NC));
    std::vector<at::Tensor> parts;
    for (int64_t q0 = 0; q0 < T; q0 += chunk) {
      const int64_t n = std::min(chunk, T - q0);
      at::Tensor qh = qs.narrow(1, q0, n).reshape({B, n, Q.HK, Q.g, Q.DI}).permute({0, 2, 1, 3, 4})
                          .reshape({B, Q.HK, n * Q.g, Q.DI});
      at::Tensor lg = at::matmul(qh, kh) * si;                                               // [B,HK,n·g,NC]
      parts.push_back(at::relu(lg).view({B, Q.HK, n, Q.g, NC}).sum({1, 3}));                // [B,n,NC]
    }
    I = parts.size() == 1 ? parts[0] : at::cat(parts, 1);
  }
  const int64_t topk = full_attention_warmup(c, ctx) ? NC : Q.topk;
  at::Tensor idx = select_blocks(I.unsqueeze(1), Q.bs, topk, false);  // [B,1,T,n+1]
  const int64_t n = idx.size(3) - 1;
  at::Tensor o = block_attend(a, a.k, a.v, idx.expand({B, d.Hkv, T, n + 1}).contiguous(), Q.bs, scale);
  at::Tensor y = at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"));
  at::Tensor aux = at::zeros({}, y.options());
  if (n > 0) {
    at::Tensor sel = idx.squeeze(1);               // [B,T,n+1]
    at::Tensor hist = sel.narrow(2, 0, n), valid = hist >= 0;
    at::Tensor pt = qsa_teacher(a.q, a.k, sel, Q.bs, scale);  // [B,T,n]
    // Student: I at the selected blocks, with gradient: Σ_{heads} ReLU(q^I·k^I_i / √d_I), fp32 for
    // half inputs.
    at::Tensor flat = (hist.clamp_min(0) + at::arange(B, hist.options()).view({B, 1, 1}) * NC).reshape({-1});
    at::Tensor kg = kb.reshape({B * NC, Q.HK, Q.DI}).index_select(0, flat).view({B, T, n, Q.HK, Q.DI});
    at::Tensor sim = at::matmul(qi.view({B, T, Q.HK, Q.g, Q.DI}), kg.permute({0, 1, 3, 4, 2})) * si;  // [B,T,HK,g,n]
    at::Tensor student = at::relu(sim).sum({2, 3});                                                 // [B,T,n]
    aux = kl_rows(pt, student, valid).mean().to(y.scalar_type());
  }
  return {{"y", y}, {"aux_loss", aux}, {"selection", idx}};
}

// Decode cache (sparse_decode.h): "k", "v" [B,L,Hkv,dh], the pooled indexer keys "ikb"
// [B,NB,HK,d_I] (after RMSNorm and RoPE at the block's first position) and a ring "ikt" [B,bs,HK·d_I]
// of the unfinished block's key projections, from which each decode step pools its own block.
TensorMap qsa_prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
  QsaDims Q = qsa_dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), NC = T / Q.bs;
  at::Tensor y = qsa_forward(in, c, ctx, b).at("y");
  c10::NoGradGuard ng;
  const auto [a, rows] = sparse_decode::prefill_kv(in, cache, c);
  const at::Tensor kt = at::linear(x.detach(), in.at("qsa_wk"));  // [B,T,HK·DI]
  at::Tensor kb = layers::rms_norm(kt.narrow(1, 0, NC * Q.bs).view({B, NC, Q.bs, Q.HK, Q.DI}).mean(2));
  kb = rope_neox_at(kb, pos_tensor(NC, Q.bs, x.device()), Q.R, c.f("rope_base"));
  sparse_decode::store(cache, "ikb", kb, sparse_decode::prefill_block_rows(cache, T, Q.bs));
  sparse_decode::store_ring(cache, "ikt", kt.narrow(1, NC * Q.bs, T - NC * Q.bs), Q.bs);
  return {{"y", y}};
}

// One token at the cache's position p (own block cur = p / bs): its block's pooled key from the
// ring, the indexer scores Σ ReLU(q^I·k^I_i / √d_I) of the pooled keys up to cur, the topk best
// complete blocks before cur plus cur, attention over their keys ≤ p.
TensorMap qsa_decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend) {
  c10::NoGradGuard ng;
  Dims d = dims(c);
  QsaDims Q = qsa_dims(c);
  const at::Tensor& x = in.at("x");
  const sparse_decode::Step st = sparse_decode::begin_step(cache, x);
  const int64_t B = x.size(0), NB = st.block_rows(Q.bs);
  const double base = c.f("rope_base");
  QKV a = sparse_decode::qkv_at(in, c, st.pos);
  sparse_decode::put(cache, "k", a.k, st.pos, st.rows);
  sparse_decode::put(cache, "v", a.v, st.pos, st.rows);
  const at::Tensor xd = x.detach();
  const at::Tensor qi = rope_neox_at(at::linear(xd, in.at("qsa_wq")).view({B, 1, Q.HI, Q.DI}), st.pos, Q.R, base);
  sparse_decode::put(cache, "ikt", at::linear(xd, in.at("qsa_wk")), st.pos.remainder(Q.bs), Q.bs);
  const at::Tensor cur = at::div(st.pos, Q.bs, "floor");
  at::Tensor kb = layers::rms_norm(cache.at("ikt").view({B, 1, Q.bs, Q.HK, Q.DI}).mean(2));  // [B,1,HK,DI]
  kb = rope_neox_at(kb, cur * Q.bs, Q.R, base);
  sparse_decode::put(cache, "ikb", kb, cur, NB);
  const at::Tensor lg = sparse_decode::row_scores(qi.view({B, Q.HK, Q.g, Q.DI}), cache.at("ikb"), st.pos, Q.bs) *
                        (1.0 / std::sqrt(double(Q.DI)));                        // [B,HK,g,NB], 0 past cur
  const at::Tensor I = at::relu(lg).sum({1, 2}).view({B, 1, NB});
  const at::Tensor sel = decode_select(I, cur, full_attention_warmup(c, ctx) ? NB : Q.topk);  // [B,1,n+1]
  at::Tensor o = decode_attend(a, cache, sel, Q.bs, st.pos, 1.0 / std::sqrt(double(d.dh)));
  sparse_decode::end_step(cache, st);
  return {{"y", at::linear(o.view({B, 1, d.H * d.dh}), in.at("c_proj"))}};
}

// Per token at length T, NC = ⌊T/bs⌋ complete blocks, n = min(topk, NC), HK = H_I/group:
//   matmul params N = attention's N_l + H_I·d_I·d + HK·d_I·d (the key projection runs on the
//       tokens of complete blocks only: −2·HK·d_I·d·(1 − NC·bs/T))
//   fwd = 2N + 2·H_I·d_I·NC          (indexer scores of every query against every complete block)
//       + 4·H·dh·(n+1)·bs            (block-sparse attention, every slot computed)
//       + 2·H·dh·T  [if n > 0]       (teacher: main logits against every key, recomputed)
//   uncounted (element-wise, invisible to FlopCounter): HK·d_I·NC·bs/T (block means)
//       + H_I·NC (sum of the ReLU scores over heads)
//   nanochat training core = 12·H·dh·min((n+1)·bs, T) + 2·H_I·d_I·NC·3 (indexer fwd + bwd)
//       + 2·H·dh·T (teacher, forward only)
//   decode at context c = 2N + 2·H_I·d_I·⌊c/bs⌋ + 4·H·dh·min((topk+1)·bs, c)
//   cache per token = main KV (2·Hkv·dh) + pooled indexer keys (HK·d_I/bs) elements; a decode step
//       reads HK·d_I·⌊c/bs⌋ + 2·Hkv·dh·min((topk+1)·bs, c) of them
LayerCost qsa_account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  Dims d = dims(c);
  QsaDims Q = qsa_dims(c);
  const int64_t NC = q.T / Q.bs, n = std::min(Q.topk, NC);
  LayerCost lc;
  const int64_t N = attention_matmul_params(c, ctx) + Q.HI * Q.DI * d.D + Q.HK * Q.DI * d.D;
  lc.params.transformer_matrices = N;
  lc.params.matmul = N;
  const double hd = double(d.H * d.dh), frac = complete_frac(q.T, Q.bs);
  lc.uncounted_flops = double(Q.HK * Q.DI) * frac + double(Q.HI * NC);
  lc.fwd_flops = 2.0 * double(N) - 2.0 * double(Q.HK * Q.DI * d.D) * (1.0 - frac) + 2.0 * double(Q.HI * Q.DI * NC) +
                 4.0 * hd * double((n + 1) * Q.bs) + (n > 0 ? 2.0 * hd * double(q.T) : 0.0) + lc.uncounted_flops;
  lc.nanochat_core_flops = 12.0 * hd * double(std::min((n + 1) * Q.bs, q.T)) + 6.0 * double(Q.HI * Q.DI * NC) +
                           (n > 0 ? 2.0 * hd * double(q.T) : 0.0);
  lc.decode_flops = 2.0 * double(N) + 2.0 * double(Q.HI * Q.DI) * double(q.context / Q.bs) +
                    4.0 * hd * double(std::min((Q.topk + 1) * Q.bs, q.context));
  lc.cache_bytes_per_token = (2.0 * double(d.Hkv * d.dh) + double(Q.HK * Q.DI) / double(Q.bs)) * double(q.dtype_bytes);
  lc.decode_read_bytes = (double(Q.HK * Q.DI) * double(q.context / Q.bs) +
                          2.0 * double(d.Hkv * d.dh) * double(std::min((Q.topk + 1) * Q.bs, q.context))) *
                         double(q.dtype_bytes);
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + 2 * d.H * d.dh + 4 * d.Hkv * d.dh + d.H * d.dh + Q.HI * Q.DI) +
                 4.0 * double(d.H);
  lc.formula = fmt::format("QSA block {} top-{} (+own): fwd 2N + 2·H_I·d_I·⌊T/{}⌋ + 4·H·dh·{}·{} + 2·H·dh·T (teacher)", Q.bs,
                           Q.topk, Q.bs, n + 1, Q.bs);
  return lc;
}

std::vector<CaseDef> qsa_cases(const ConfigSpec& spec) {
  // 4 layers, d=64, 4 heads of 16; blocks of 4, 3 history blocks (12 tokens) plus the own block;
  // indexer 4 heads of 8 (4 rotary dims), 2 query heads per key head.
  Config base = spec.parse(
      "n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,qsa_block=4,qsa_topk=3,qsa_heads=4,qsa_dim=8,qsa_group=2,"
      "qsa_rope_dim=4");
  return {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_T15_all_selected", base, 2, 15, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T45", base, 2, 45, 1},
      {"layer3_last_ve_gqa_T29", base.with("kv_ratio", int64_t(2)), 1, 29, 3},
      {"layer2_mqa_T33", base.with("kv_ratio", int64_t(0)), 1, 33, 2},
      {"layer2_block5_top4_group4_T70",
       base.with("qsa_block", int64_t(5)).with("qsa_topk", int64_t(4)).with("qsa_group", int64_t(4)).with("qsa_rope_dim", int64_t(8)),
       1, 70, 2},
  };
}

MethodSpec qsa_spec() {
  SparseMethodDesc d;
  d.name = "qsa";
  d.summary = "QSA: ReLU indexer on mean-pooled 4-key blocks (RMSNorm, partial RoPE, shared keys) picks 64 blocks + tail; KL aux loss";
  d.citation = "Qwen report §2.1.2 as adapted by seed 001; nanochat attention layer";
  d.warmup = true;
  d.knobs = [](ConfigSpec& s) {
    s.i("qsa_block", 4, "keys mean-pooled per indexer block (= selection block)", 1)
        .i("qsa_topk", 64, "complete history blocks selected per query (256 tokens), the own tail block added", 1)
        .i("qsa_heads", 16, "indexer query heads H_I", 1)
        .i("qsa_dim", 64, "indexer head dim d_I", 2)
        .i("qsa_group", 4, "indexer query heads sharing one pooled key head", 1)
        .i("qsa_rope_dim", 32, "rotary dims of the indexer heads (first ones, NeoX style)", 0)
        .rule([](const Config& c) {
          const int64_t R = c.i("qsa_rope_dim");
          if (R % 2 != 0 || R > c.i("qsa_dim"))
            throw InputError(fmt::format("qsa_rope_dim {} must be even and at most qsa_dim {}", R, c.i("qsa_dim")));
          if (c.i("qsa_heads") % c.i("qsa_group") != 0)
            throw InputError(fmt::format("qsa_heads {} is not divisible by qsa_group {}", c.i("qsa_heads"), c.i("qsa_group")));
        });
  };
  d.ops = {"block_topk", "block_sparse_attention"};
  d.params = qsa_params;
  d.reference = qsa_reference;
  d.forward = qsa_forward;
  d.account = qsa_account;
  d.cases = qsa_cases;
  d.prefill = qsa_prefill;
  d.decode = qsa_decode;
  MethodSpec m = sparse_method(d);
  // Training presets: the dense warm-up (512 steps by default) would cover all of small's 40 steps:
  // a quarter of them.
  // At small the LibTorch path's per-query-block key gathers for 32 rows need more than an H200's
  // memory in training: the same step in micro-batches of 8 rows (gradients accumulated).
  m.presets["small"] = {"full_attention_warmup_frac=0.25", 8};
  // gpu-d12 (2048 tokens): one row per micro-batch holds the LibTorch path's gathers in memory.
  m.presets["gpu-d12"] = {"full_attention_warmup_frac=0.25", 1};
  return m;
}

// ============================================================================================ NSA

std::vector<ParamDef> nsa_params(const Config& c, const LayerCtx& ctx) {
  Dims d = dims(c);
  const int64_t bs = c.i("nsa_block");
  const double s = std::sqrt(3.0) / std::sqrt(double(bs * d.dh));
  std::vector<ParamDef> p = attention_params(c, ctx);
  p.push_back({"nsa_gate", {3 * d.H, d.D}, ParamGroup::TransformerMatrix, true, "const", 0.0, 0});
  p.push_back({"nsa_cmp_k", {d.dh, bs * d.dh}, ParamGroup::TransformerMatrix, false, "uniform", -s, s});
  p.push_back({"nsa_cmp_v", {d.dh, bs * d.dh}, ParamGroup::TransformerMatrix, false, "uniform", -s, s});
  return p;
}

TensorMap nsa_reference(const TensorMap& in, const Config& c, const LayerCtx&, reference::LayerSelection& sel) {
  return {{"y", reference::nsa_layer(in.at("x"), in.get_or("ve", at::Tensor()), ref_weights(in), ref_shape(c),
                                     c.i("nsa_block"), c.i("nsa_topk"), c.i("nsa_window"), &sel)}};
}

// The same code on every backend (the *_fast entry points and the attention kernels pick the device's).
TensorMap nsa_forward(const TensorMap& in, const Config& c, const LayerCtx&, Backend backend) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), G = d.H / d.Hkv, bs = c.i("nsa_block"), NC = T / bs;
  const double scale = 1.0 / std::sqrt(double(d.dh));
  QKV a = qkv(in, c);
  // Compression branch.
  at::Tensor o_cmp = at::zeros({B, T, d.H, d.dh}, a.v.options());
  at::Tensor scores = at::zeros({B, d.Hkv, T, 0}, a.q.options());
  if (NC > 0) {
    auto compress = [&](const at::Tensor& t, const char* w) {  // [B,T,Hkv,dh] -> [B,Hkv,NC,dh]
      at::Tensor blk = t.narrow(1, 0, NC * bs).reshape({B, NC, bs, d.Hkv, d.dh});
      return at::linear(blk.permute({0, 3, 1, 2, 4}).reshape({B, d.Hkv, NC, bs * d.dh}), in.at(w));
    };
    at::Tensor kc = compress(a.k, "nsa_cmp_k"), vc = compress(a.v, "nsa_cmp_v");
    at::Tensor qh = a.q.reshape({B, T, d.Hkv, G, d.dh}).permute({0, 2, 3, 1, 4}).reshape({B, d.Hkv, G * T, d.dh});
    at::Tensor lg = (at::matmul(qh, kc.transpose(-1, -2)) * scale).view({B, d.Hkv, G, T, NC});
    auto lo = at::TensorOptions().dtype(at::kLong).device(x.device());
    at::Tensor vis = ((at::arange(NC, lo) + 1) * bs - 1).view({1, NC}) <= at::arange(T, lo).view({T, 1});  // [T,NC]
    at::Tensor lf = layers::is_half(lg) ? lg.to(at::kFloat) : lg;
    at::Tensor p = at::softmax(lf.masked_fill(vis.logical_not(), kMaskedLogit), -1).masked_fill(vis.logical_not(), 0.0);
    scores = p.detach().sum(2);  // [B,Hkv,T,NC]: summed over the group's query heads
    p = p.to(vc.scalar_type()).view({B, d.Hkv, G * T, NC});
    o_cmp = at::matmul(p, vc).view({B, d.Hkv, G, T, d.dh}).permute({0, 3, 1, 2, 4}).reshape({B, T, d.H, d.dh});
  }
  // Selection branch.
  at::Tensor idx = select_blocks(scores, bs, c.i("nsa_topk"), false);  // [B,Hkv,T,n+1]
  at::Tensor o_slc = block_attend(a, a.k, a.v, idx, bs, scale);
  // Window branch: op attention's paths without its input checks (q, k, v are the layer's own).
  at::Tensor o_win;
  NvtxRange win_range(op_range("attention"));
#if defined(MIXBENCH_WITH_CUDA)
  if (backend == Backend::CUDA) o_win = attention_cuda(a.q, a.k, a.v, scale, c.i("nsa_window"), 0.0);
#endif
  if (!o_win.defined()) o_win = attention_cpu(a.q, a.k, a.v, scale, c.i("nsa_window"), 0.0);
  at::Tensor g = at::sigmoid(at::linear(x, in.at("nsa_gate"))).view({B, T, 3, d.H, 1});
  at::Tensor o = g.select(2, 0) * o_cmp + g.select(2, 1) * o_slc + g.select(2, 2) * o_win;
  return {{"y", at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"))}, {"selection", idx}};
}

// Decode cache (sparse_decode.h): "k", "v" [B,L,Hkv,dh] and the compressed keys and values "ck",
// "cv" [B,NB,Hkv,dh]; each decode step compresses its own block from the cached keys and values
// (final when the block's last key is in; the compression branch reads a block only from then on).
TensorMap nsa_prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), bs = c.i("nsa_block"), NC = T / bs;
  at::Tensor y = nsa_forward(in, c, ctx, b).at("y");
  c10::NoGradGuard ng;
  const auto [a, rows] = sparse_decode::prefill_kv(in, cache, c);
  auto compress = [&](const at::Tensor& t, const char* w) {  // [B,T,Hkv,dh] -> [B,NC,Hkv,dh]
    at::Tensor blk = t.narrow(1, 0, NC * bs).reshape({B, NC, bs, d.Hkv, d.dh});
    return at::linear(blk.permute({0, 3, 1, 2, 4}).reshape({B, d.Hkv, NC, bs * d.dh}), in.at(w)).permute({0, 2, 1, 3});
  };
  const int64_t NB = sparse_decode::prefill_block_rows(cache, T, bs);
  sparse_decode::store(cache, "ck", compress(a.k, "nsa_cmp_k"), NB);
  sparse_decode::store(cache, "cv", compress(a.v, "nsa_cmp_v"), NB);
  return {{"y", y}};
}

// One token at the cache's position p (own block cur = p / bs): compression branch over the blocks
// complete at p, selection of the nsa_topk best complete blocks before cur per KV head by the
// compressed attention summed over the group's heads, plus cur; window branch over the last
// nsa_window keys; the three mixed by the token's gates.
TensorMap nsa_decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx&, Backend) {
  c10::NoGradGuard ng;
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const sparse_decode::Step st = sparse_decode::begin_step(cache, x);
  const int64_t B = x.size(0), G = d.H / d.Hkv, bs = c.i("nsa_block"), NB = st.block_rows(bs);
  const double scale = 1.0 / std::sqrt(double(d.dh));
  QKV a = sparse_decode::qkv_at(in, c, st.pos);
  sparse_decode::put(cache, "k", a.k, st.pos, st.rows);
  sparse_decode::put(cache, "v", a.v, st.pos, st.rows);
  const at::Tensor cur = at::div(st.pos, bs, "floor");
  auto compress = [&](const char* buf, const char* w) {  // the own block's rows -> [B,1,Hkv,dh]
    const at::Tensor blk = sparse_decode::block_rows_of(cache.at(buf), cur, bs);  // [B,bs,Hkv,dh]
    return at::linear(blk.permute({0, 2, 1, 3}).reshape({B, d.Hkv, 1, bs * d.dh}), in.at(w)).permute({0, 2, 1, 3});
  };
  sparse_decode::put(cache, "ck", compress("k", "nsa_cmp_k"), cur, NB);
  sparse_decode::put(cache, "cv", compress("v", "nsa_cmp_v"), cur, NB);
  // Compression branch: the blocks whose last key (i+1)·bs − 1 is ≤ p.
  const at::Tensor qh = a.q.view({B, d.Hkv, G, d.dh});
  const at::Tensor lg = sparse_decode::row_scores(qh, cache.at("ck"), st.pos, bs) * scale;  // [B,Hkv,G,NB], 0 past cur
  const at::Tensor vis = ((at::arange(NB, st.pos.options()) + 1) * bs - 1 <= st.pos).view({1, 1, 1, NB});
  const at::Tensor lf = layers::is_half(lg) ? lg.to(at::kFloat) : lg;
  at::Tensor p = at::softmax(lf.masked_fill(vis.logical_not(), kMaskedLogit), -1).masked_fill(vis.logical_not(), 0.0);
  const at::Tensor scores = p.sum(2);  // [B,Hkv,NB]
  const at::Tensor o_cmp = sparse_decode::row_mix(p, cache.at("cv"), st.pos, bs).view({B, d.H, d.dh});
  // Selection branch.
  const at::Tensor sel = decode_select(scores, cur, c.i("nsa_topk"));  // [B,Hkv,n+1]
  const at::Tensor o_slc = decode_attend(a, cache, sel, bs, st.pos, scale);
  // Window branch: keys p − j, j < min(window, L).
  at::Tensor o_win;
  {
    NvtxRange r(op_range("attention"));
    const int64_t nw = std::min(c.i("nsa_window"), st.rows);
    const at::Tensor keys = (st.pos - at::arange(nw, st.pos.options())).view({1, 1, nw});
    o_win = sparse_decode::attend_keys(a.q.view({B, d.H, d.dh}), cache.at("k"), cache.at("v"), keys, keys >= 0, scale);
  }
  const at::Tensor g = at::sigmoid(at::linear(x, in.at("nsa_gate"))).view({B, 3, d.H, 1});
  const at::Tensor o = g.select(1, 0) * o_cmp + g.select(1, 1) * o_slc + g.select(1, 2) * o_win;
  sparse_decode::end_step(cache, st);
  return {{"y", at::linear(o.reshape({B, 1, d.H * d.dh}), in.at("c_proj"))}};
}

// Per token at length T, NC = ⌊T/bs⌋ complete blocks, n = min(topk, NC), f = NC·bs/T:
//   matmul params N = attention's N_l + 3·H·d (gates); the compression maps (2·dh·bs·dh) run once
//       per block: 2·2·Hkv·dh·dh·f
//   fwd = 2N + 4·Hkv·dh²·f + 4·H·dh·NC       (compressed attention: every query × every block)
//       + 4·H·dh·(n+1)·bs                    (selection, block-sparse op, every slot computed)
//       + 4·H·dh·V(T, w)                     (window; V = mean visible keys, layers::mean_visible)
//   uncounted: H·NC (group sums of the block scores)
//   nanochat training core = 3·(4·Hkv·dh²·f + 4·H·dh·NC + 4·H·dh·min((n+1)·bs, T) + 4·H·dh·V(T,w))
//   decode at context c = 2N + 4·Hkv·dh² + 4·H·dh·(⌊c/bs⌋ + min((topk+1)·bs, c) + min(w, c))
//   cache per token = raw KV (2·Hkv·dh) + compressed KV (2·Hkv·dh/bs) elements; a decode step reads
//       2·Hkv·dh·(⌊c/bs⌋ + min((topk+1)·bs, c) + min(w, c)) of them (the window's keys counted again)
LayerCost nsa_account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  Dims d = dims(c);
  const int64_t bs = c.i("nsa_block"), topk = c.i("nsa_topk"), w = c.i("nsa_window");
  const int64_t NC = q.T / bs, n = std::min(topk, NC);
  LayerCost lc;
  const int64_t N = attention_matmul_params(c, ctx) + 3 * d.H * d.D;
  lc.params.transformer_matrices = N + 2 * d.dh * bs * d.dh;
  lc.params.matmul = N;
  const double hd = double(d.H * d.dh), f = complete_frac(q.T, bs), dh = double(d.dh);
  const double cmp = 4.0 * double(d.Hkv) * dh * dh * f, win = 4.0 * hd * layers::mean_visible(q.T, w);
  lc.uncounted_flops = double(d.H * NC);
  const double core = cmp + 4.0 * hd * double(NC) + 4.0 * hd * double((n + 1) * bs) + win;
  lc.fwd_flops = 2.0 * double(N) + core + lc.uncounted_flops;
  lc.nanochat_core_flops =
      3.0 * (cmp + 4.0 * hd * double(NC) + 4.0 * hd * double(std::min((n + 1) * bs, q.T)) + win);
  lc.decode_flops = 2.0 * double(N) + 4.0 * double(d.Hkv) * dh * dh +
                    4.0 * hd * double(q.context / bs + std::min((topk + 1) * bs, q.context) + std::min(w, q.context));
  lc.cache_bytes_per_token = (2.0 * double(d.Hkv * d.dh) * (1.0 + 1.0 / double(bs))) * double(q.dtype_bytes);
  lc.decode_read_bytes = 2.0 * double(d.Hkv * d.dh) *
                         double(q.context / bs + std::min((topk + 1) * bs, q.context) + std::min(w, q.context)) *
                         double(q.dtype_bytes);
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + 2 * d.H * d.dh + 4 * d.Hkv * d.dh + 4 * d.H * d.dh + 3 * d.H) +
                 12.0 * double(d.H);
  lc.formula = fmt::format("NSA block {} top-{} (+own), window {}: fwd 2N + 4·Hkv·dh²·f + 4·H·dh·(⌊T/{}⌋ + {}·{} + V(T,{}))",
                           bs, topk, w, bs, n + 1, bs, w);
  return lc;
}

std::vector<CaseDef> nsa_cases(const ConfigSpec& spec) {
  // 4 layers, d=64, 4 heads of 16; blocks of 4, 2 history blocks plus the own block, window 6.
  Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,nsa_block=4,nsa_topk=2,nsa_window=6");
  return {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_T11_all_selected_window16", base.with("nsa_window", int64_t(16)), 2, 11, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T45", base, 2, 45, 1},
      {"layer3_last_ve_gqa_T29", base.with("kv_ratio", int64_t(2)), 1, 29, 3},
      {"layer2_mqa_T33", base.with("kv_ratio", int64_t(0)), 1, 33, 2},
      {"layer2_block5_top3_window9_T70",
       base.with("nsa_block", int64_t(5)).with("nsa_topk", int64_t(3)).with("nsa_window", int64_t(9)), 1, 70, 2},
  };
}

MethodSpec nsa_spec() {
  SparseMethodDesc d;
  d.name = "nsa";
  d.summary = "NSA: compressed (32-token blocks), selected (top-8 blocks + own) and 512-key window branches, per-head sigmoid gates";
  d.citation = "Native Sparse Attention, arXiv 2502.11089 §3.2–3.3; nanochat attention layer";
  d.knobs = [](ConfigSpec& s) {
    s.i("nsa_block", 32, "tokens per compression block (= selection block, non-overlapping)", 1)
        .i("nsa_topk", 8, "complete history blocks selected per query and KV head (256 tokens), the own block added", 1)
        .i("nsa_window", 512, "sliding-window branch: visible keys including self", 1);
  };
  d.ops = {"block_topk", "block_sparse_attention", "attention"};
  d.params = nsa_params;
  d.reference = nsa_reference;
  d.forward = nsa_forward;
  d.account = nsa_account;
  d.cases = nsa_cases;
  d.prefill = nsa_prefill;
  d.decode = nsa_decode;
  MethodSpec m = sparse_method(d);
  // gpu-d12: with no CUDA kernel, the LibTorch path's gathers for 32 rows × 2048 tokens need more
  // than an H200's memory: micro-batches of 2 rows.
  m.presets["gpu-d12"].micro_batch = 2;
  return m;
}

// =========================================================================================== Seer

std::vector<ParamDef> seer_params(const Config& c, const LayerCtx& ctx) {
  Dims d = dims(c);
  const int64_t dg = c.i("seer_gate_dim");
  const double sq = std::sqrt(3.0) / std::sqrt(double(d.dh)), sk = std::sqrt(3.0) / std::sqrt(double(3 * d.dh));
  std::vector<ParamDef> p = attention_params(c, ctx);
  p.push_back({"seer_wq", {d.H, dg, d.dh}, ParamGroup::TransformerMatrix, true, "uniform", -sq, sq});
  p.push_back({"seer_wk", {d.Hkv, dg, 3 * d.dh}, ParamGroup::TransformerMatrix, false, "uniform", -sk, sk});
  return p;
}

// seer_gate_keys: "pooled_rope" (the original's key side, the default) or "rotated" (the earlier gate).
bool seer_pooled_rope(const Config& c) { return c.s("seer_gate_keys") == "pooled_rope"; }

// The gate's pooled key of blocks of keys kb [B,N,bs,Hkv,dh] (the layer's keys before RoPE,
// 1.2·RMSNorm(c_k x), for pooled_rope; after it otherwise): [max; min; mean] projected by W^G_k and,
// for pooled_rope, rotated at the blocks' first positions `first` (double [N]) -> [B,N,Hkv,d_g].
at::Tensor seer_gate_keys(const at::Tensor& kb, const TensorMap& in, const Config& c, const at::Tensor& first) {
  const int64_t B = kb.size(0), N = kb.size(1), Hkv = kb.size(3), dh = kb.size(4), dg = c.i("seer_gate_dim");
  at::Tensor pooled = at::cat({std::get<0>(kb.max(2)), std::get<0>(kb.min(2)), kb.mean(2)}, -1);  // [B,N,Hkv,3dh]
  at::Tensor kg = at::bmm(pooled.permute({2, 0, 1, 3}).reshape({Hkv, B * N, 3 * dh}), in.at("seer_wk").transpose(1, 2));
  kg = kg.view({Hkv, B, N, dg}).permute({1, 2, 0, 3});                                            // [B,N,Hkv,dg]
  // nanochat's rotation is NeoX's by −θ: block i at position i·bs
  if (seer_pooled_rope(c)) kg = rope_neox_at(kg, -first, dg, c.f("rope_base"));
  return kg;
}

// The keys the gate pools: 1.2·RMSNorm of the keys before RoPE (pooled_rope), else the layer's keys.
at::Tensor seer_pool_source(const QKV& a, const Config& c) {
  return seer_pooled_rope(c) ? layers::rms_norm(a.k_raw.detach()) * 1.2 : a.k.detach();
}

TensorMap seer_reference(const TensorMap& in, const Config& c, const LayerCtx&, reference::LayerSelection& sel) {
  reference::BlockOut o = reference::seer_layer(in.at("x"), in.get_or("ve", at::Tensor()), ref_weights(in), ref_shape(c),
                                                c.i("seer_block"), c.i("seer_topk"), seer_pooled_rope(c), &sel);
  return {{"y", o.y}, {"aux_loss", o.aux_loss}};
}

// The same code on every backend (the *_fast entry points pick the device's kernels); the teacher's
// full causal attention runs in query chunks (seer_teacher).
TensorMap seer_forward(const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), G = d.H / d.Hkv, bs = c.i("seer_block"), NC = T / bs;
  const int64_t dg = c.i("seer_gate_dim");
  const double scale = 1.0 / std::sqrt(double(d.dh));
  QKV a = qkv(in, c);
  at::Tensor S = at::zeros({B, d.H, T, 0}, a.q.options());  // gate logits [B,H,T,NC]
  if (NC > 0) {
    at::Tensor qd = a.q.detach();
    at::Tensor kb = seer_pool_source(a, c).narrow(1, 0, NC * bs).view({B, NC, bs, d.Hkv, d.dh});
    at::Tensor kg = seer_gate_keys(kb, in, c, pos_tensor(NC, bs, x.device()));  // [B,NC,Hkv,dg]
    at::Tensor qg = at::bmm(qd.permute({2, 0, 1, 3}).reshape({d.H, B * T, d.dh}), in.at("seer_wq").transpose(1, 2));
    qg = qg.view({d.Hkv, G, B, T, dg}).permute({2, 0, 1, 3, 4}).reshape({B, d.Hkv, G * T, dg});
    S = (at::matmul(qg, kg.permute({0, 2, 3, 1})) * (1.0 / std::sqrt(double(dg)))).view({B, d.H, T, NC});
  }
  const int64_t topk = full_attention_warmup(c, ctx) ? NC : c.i("seer_topk");
  at::Tensor idx = select_blocks(S, bs, topk, false);  // [B,H,T,n+1]
  const int64_t n = idx.size(3) - 1;
  at::Tensor k = G > 1 ? a.k.repeat_interleave(G, 2) : a.k;  // per-query-head selections
  at::Tensor v = G > 1 ? a.v.repeat_interleave(G, 2) : a.v;
  at::Tensor o = block_attend(a, k, v, idx, bs, scale);
  at::Tensor y = at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"));
  at::Tensor aux = at::zeros({}, y.options());
  if (n > 0) {
    at::Tensor valid = candidate_mask(T, NC, bs, x.device()).view({1, 1, T, NC});
    at::Tensor gt = seer_teacher(a.q, a.k, bs, scale);  // [B,H,T,NC]
    aux = kl_rows(gt, S, valid.expand({B, d.H, T, NC})).mean().to(y.scalar_type());
  }
  return {{"y", y}, {"aux_loss", aux}, {"selection", idx}};
}

// Decode cache (sparse_decode.h): "k", "v" [B,L,Hkv,dh], the gate keys "gk" [B,NB,Hkv,d_g] and a
// ring "gkt" [B,bs,Hkv,dh] of the unfinished block's pooled-from keys, from which each decode step
// pools its own block.
TensorMap seer_prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1), bs = c.i("seer_block"), NC = T / bs;
  at::Tensor y = seer_forward(in, c, ctx, b).at("y");
  c10::NoGradGuard ng;
  const auto [a, rows] = sparse_decode::prefill_kv(in, cache, c);
  const at::Tensor kd = seer_pool_source(a, c);
  const at::Tensor kg = seer_gate_keys(kd.narrow(1, 0, NC * bs).view({B, NC, bs, d.Hkv, d.dh}), in, c,
                                       pos_tensor(NC, bs, x.device()));
  sparse_decode::store(cache, "gk", kg, sparse_decode::prefill_block_rows(cache, T, bs));
  sparse_decode::store_ring(cache, "gkt", kd.narrow(1, NC * bs, T - NC * bs), bs);
  return {{"y", y}};
}

// One token at the cache's position p (own block cur = p / bs): its block's gate key from the ring,
// the gate logits Q̃·K̃ / √d_g of the gate keys up to cur per query head, the seer_topk best
// complete blocks before cur plus cur per head, attention over their keys ≤ p.
TensorMap seer_decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend) {
  c10::NoGradGuard ng;
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const sparse_decode::Step st = sparse_decode::begin_step(cache, x);
  const int64_t B = x.size(0), G = d.H / d.Hkv, bs = c.i("seer_block"), NB = st.block_rows(bs);
  const int64_t dg = c.i("seer_gate_dim");
  QKV a = sparse_decode::qkv_at(in, c, st.pos);
  sparse_decode::put(cache, "k", a.k, st.pos, st.rows);
  sparse_decode::put(cache, "v", a.v, st.pos, st.rows);
  sparse_decode::put(cache, "gkt", seer_pool_source(a, c), st.pos.remainder(bs), bs);
  const at::Tensor cur = at::div(st.pos, bs, "floor");
  const at::Tensor kg = seer_gate_keys(cache.at("gkt").view({B, 1, bs, d.Hkv, d.dh}), in, c, (cur * bs).to(at::kDouble));
  sparse_decode::put(cache, "gk", kg, cur, NB);
  at::Tensor qg = at::bmm(a.q.permute({2, 0, 1, 3}).reshape({d.H, B, d.dh}), in.at("seer_wq").transpose(1, 2));  // [H,B,dg]
  qg = qg.view({d.Hkv, G, B, dg}).permute({2, 0, 1, 3});                                                      // [B,Hkv,G,dg]
  const at::Tensor S = (sparse_decode::row_scores(qg, cache.at("gk"), st.pos, bs) * (1.0 / std::sqrt(double(dg))))
                           .view({B, d.H, NB});  // 0 past cur
  const at::Tensor sel = decode_select(S, cur, full_attention_warmup(c, ctx) ? NB : c.i("seer_topk"));  // [B,H,n+1]
  at::Tensor o = decode_attend(a, cache, sel, bs, st.pos, 1.0 / std::sqrt(double(d.dh)));
  sparse_decode::end_step(cache, st);
  return {{"y", at::linear(o.view({B, 1, d.H * d.dh}), in.at("c_proj"))}};
}

// Per token at length T, NC = ⌊T/bs⌋ complete blocks, n = min(topk, NC), f = NC·bs/T:
//   matmul params N = attention's N_l + H·d_g·dh (query gate); the key gate (Hkv·d_g·3dh) runs
//       once per pooled block: 2·Hkv·d_g·3dh·f/bs
//   fwd = 2N + 6·Hkv·d_g·dh·f/bs + 2·H·d_g·NC   (gate logits of every query against every block)
//       + 4·H·dh·(n+1)·bs                      (block-sparse op, every slot computed)
//       + 2·H·dh·T  [if n > 0]                 (teacher: full causal attention logits)
//   uncounted: 3·Hkv·dh·f (max, min and sum pooling, element-wise); like the layer's own RoPE and
//       QK-norm, the pooled_rope gate's RMSNorm of the unrotated keys and rotation of the pooled keys
//       are not billed (the same matmuls as the rotated gate)
//   nanochat training core = 12·H·dh·min((n+1)·bs, T) + 3·(6·Hkv·d_g·dh·f/bs + 2·H·d_g·NC) + 2·H·dh·T
//   decode at context c = 2N + 2·H·d_g·⌊c/bs⌋ + 4·H·dh·min((topk+1)·bs, c)
//   cache per token = main KV (2·Hkv·dh) + gate keys (Hkv·d_g/bs) elements; a decode step reads
//       Hkv·d_g·⌊c/bs⌋ + 2·Hkv·dh·min((topk+1)·bs, c) of them
LayerCost seer_account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  Dims d = dims(c);
  const int64_t bs = c.i("seer_block"), topk = c.i("seer_topk"), dg = c.i("seer_gate_dim");
  const int64_t NC = q.T / bs, n = std::min(topk, NC);
  LayerCost lc;
  const int64_t N = attention_matmul_params(c, ctx) + d.H * dg * d.dh;
  lc.params.transformer_matrices = N + d.Hkv * dg * 3 * d.dh;
  lc.params.matmul = N;
  const double hd = double(d.H * d.dh), f = complete_frac(q.T, bs);
  const double gate = 6.0 * double(d.Hkv * dg * d.dh) * f / double(bs) + 2.0 * double(d.H * dg * NC);
  const double teacher = n > 0 ? 2.0 * hd * double(q.T) : 0.0;
  lc.uncounted_flops = 3.0 * double(d.Hkv * d.dh) * f;
  lc.fwd_flops = 2.0 * double(N) + gate + 4.0 * hd * double((n + 1) * bs) + teacher + lc.uncounted_flops;
  lc.nanochat_core_flops = 12.0 * hd * double(std::min((n + 1) * bs, q.T)) + 3.0 * gate + teacher;
  lc.decode_flops = 2.0 * double(N) + 2.0 * double(d.H * dg) * double(q.context / bs) +
                    4.0 * hd * double(std::min((topk + 1) * bs, q.context));
  lc.cache_bytes_per_token = (2.0 * double(d.Hkv * d.dh) + double(d.Hkv * dg) / double(bs)) * double(q.dtype_bytes);
  lc.decode_read_bytes = (double(d.Hkv * dg) * double(q.context / bs) +
                          2.0 * double(d.Hkv * d.dh) * double(std::min((topk + 1) * bs, q.context))) *
                         double(q.dtype_bytes);
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + 2 * d.H * d.dh + 4 * d.Hkv * d.dh + d.H * d.dh + d.H * dg) +
                 4.0 * double(d.H);
  lc.formula = fmt::format("Seer block {} top-{} (+own), d_g {}: fwd 2N + gate + 4·H·dh·{}·{} + 2·H·dh·T (teacher)", bs, topk,
                           dg, n + 1, bs);
  return lc;
}

std::vector<CaseDef> seer_cases(const ConfigSpec& spec) {
  // 4 layers, d=64, 4 heads of 16; blocks of 4, 2 history blocks plus the own block, gate dim 8.
  Config base = spec.parse("n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,seer_block=4,seer_topk=2,seer_gate_dim=8");
  return {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_T11_all_selected", base, 2, 11, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T45", base, 2, 45, 1},
      {"layer3_last_ve_gqa_T29", base.with("kv_ratio", int64_t(2)), 1, 29, 3},
      // T = 34: at T = 33 these inputs put two gate scores 1.5e-4 apart (of 34) at a top-k boundary,
      // where no finite difference can be taken
      {"layer2_mqa_T34", base.with("kv_ratio", int64_t(0)), 1, 34, 2},
      {"layer2_block5_top3_T70", base.with("seer_block", int64_t(5)).with("seer_topk", int64_t(3)), 1, 70, 2},
  };
}

MethodSpec seer_spec() {
  SparseMethodDesc d;
  d.name = "seer";
  d.summary = "SeerAttention-style: token-query gate on max/min/avg-pooled 64-key blocks (pre-RoPE, rotated at the block start) picks 4 blocks + own; KL to block-max teacher";
  d.citation = "microsoft/SeerAttention seer_attn/attn_gate.py (arXiv 2410.13276), adapted by seed 001; nanochat attention layer";
  d.warmup = true;
  d.knobs = [](ConfigSpec& s) {
    s.i("seer_block", 64, "keys pooled per gate block (= selection block)", 1)
        .i("seer_topk", 4, "complete history blocks selected per query and head (256 tokens), the own block added", 1)
        .i("seer_gate_dim", 128, "gate projection dim d_g", 1)
        .s("seer_gate_keys", "pooled_rope",
           "gate keys: pooled_rope = pool the layer's keys before RoPE, project, rotate at the block's first position "
           "(the original AttnGate); rotated = pool the keys after RoPE and QK-norm, no rotation of the pooled keys",
           {"pooled_rope", "rotated"})
        .rule([](const Config& c) {
          if (seer_pooled_rope(c) && c.i("seer_gate_dim") % 2 != 0)
            throw InputError(fmt::format("seer_gate_dim {} must be even for seer_gate_keys=pooled_rope (the pooled "
                                         "keys are rotated in pairs)", c.i("seer_gate_dim")));
        });
  };
  d.ops = {"block_topk", "block_sparse_attention"};
  d.params = seer_params;
  d.reference = seer_reference;
  d.forward = seer_forward;
  d.account = seer_account;
  d.cases = seer_cases;
  d.prefill = seer_prefill;
  d.decode = seer_decode;
  MethodSpec m = sparse_method(d);
  // Training preset small: as qsa's (the warm-up a quarter of the run, micro-batches of 8 rows).
  m.presets["small"] = {"full_attention_warmup_frac=0.25", 8};
  // gpu-d12 (2048 tokens): one row per micro-batch holds the LibTorch path's gathers in memory.
  m.presets["gpu-d12"] = {"full_attention_warmup_frac=0.25", 1};
  return m;
}

MIXBENCH_REGISTER(qsa_spec());
MIXBENCH_REGISTER(nsa_spec());
MIXBENCH_REGISTER(seer_spec());

}  // namespace
}  // namespace mixbench
