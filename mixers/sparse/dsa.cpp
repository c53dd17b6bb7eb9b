// Method `dsa`: nanochat's attention layer (as dense_full) whose attention is restricted to the
// top-k keys chosen by DeepSeek-V3.2's lightning indexer (deepseek-ai/DeepSeek-V3.2-Exp
// inference/model.py `Indexer`), adapted to the MHA backbone (seed 001):
//   q^I_t   = (W^I_q h_t) split into H_I heads of d_I       (h = the layer input, detached)
//   k^I_s   = LayerNorm(W^I_k h_s)                          (one key head; weight and bias, eps 1e-6)
//   RoPE on the first idx_rope_dim dims of q^I and k^I, NeoX half-split rotation by +θ
//   (split order [rope, no-rope]), base = the layer's rope_base
//   w_t     = (W_w h_t) · H_I^-½ · d_I^-½                   (signed, no activation)
//   I_{t,s} = Σ_j w_{t,j} · ReLU(q^I_{t,j} · k^I_s), s ≤ t; S_t = top min(k, t+1) keys (op dsa_indexer,
//   ties to the lower key); main attention = op sparse_attention over S_t (scale dh^-½).
// Auxiliary output `aux_loss` (sparse stage of the DSA report): for every token,
//   p_t = Σ_heads softmax over S_t of the main attention logits (q, k detached), L1-normalised;
//   KL(p_t ‖ softmax over S_t of I_{t,·}); aux_loss = mean over the B·T tokens.
// Teacher and indexer input are detached, so aux_loss reaches only the indexer's parameters and y
// none of them (the selection is not differentiable). Seed 001 weights aux_loss 1 per layer,
// summed over layers. The layer always computes aux_loss (its cost is in the accountant).
// Precision: for a bf16/fp16 layer the indexer (projections, LayerNorm, RoPE, scores, KL) runs in
// fp32 from the half-precision input and weights (indexer_precision, sparse_method.h).
// Full-attention warm-up (sparse_method.h): during the first full_attention_warmup_steps training steps
// S_t = every key s ≤ t (dense causal attention) and the KL's teacher covers the full history.
// Indexer size (idx_heads = 0, idx_dim = 0, idx_rope_dim = -1, the defaults): V3.2's indexer (64
// heads of 128, 64 of them rotary) is half as wide as the attention it selects for (128 heads of
// 128) and has the main heads' head dim; carried over, H_I = max(1, ⌊H/2⌋), d_I = dh and the rotary
// dims ⌊d_I/2⌋ rounded down to even — H_I·d_I ≈ d_model/2 in the backbone's H·dh = d_model (d12:
// 3 heads of 128; V3.2's own 64 × 128 would cost more than the whole layer it selects for). The
// accountant reports the indexer's share of the layer's training FLOPs (cost part "indexer").
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <fmt/format.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "harness/backbone.h"
#include "harness/cost_parts.h"
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

constexpr double kIndexerLnEps = 1e-6;

// The indexer's heads, head dim and rotary dims: the config's, or the size rule (header) for 0 / -1.
struct IndexerDims {
  int64_t HI, DI, R;
};

IndexerDims indexer_dims(const Config& c) {
  const Dims d = dims(c);
  IndexerDims x;
  x.HI = c.i("idx_heads") > 0 ? c.i("idx_heads") : std::max<int64_t>(1, d.H / 2);
  x.DI = c.i("idx_dim") > 0 ? c.i("idx_dim") : d.dh;
  x.R = c.i("idx_rope_dim") >= 0 ? c.i("idx_rope_dim") : x.DI / 2 / 2 * 2;
  return x;
}

std::vector<ParamDef> params(const Config& c, const LayerCtx& ctx) {
  Dims d = dims(c);
  const auto [HI, DI, R] = indexer_dims(c);
  const double s = std::sqrt(3.0) / std::sqrt(double(d.D));
  std::vector<ParamDef> p = attention_params(c, ctx);
  p.push_back({"idx_wq", {HI * DI, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"idx_wk", {DI, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"idx_w", {HI, d.D}, ParamGroup::TransformerMatrix, true, "uniform", -s, s});
  p.push_back({"idx_k_norm_w", {DI}, ParamGroup::Scalar, false, "const", 1.0, 0});
  p.push_back({"idx_k_norm_b", {DI}, ParamGroup::Scalar, false, "const", 0.0, 0});
  return p;
}

TensorMap reference_fn(const TensorMap& in, const Config& c, const LayerCtx&, reference::LayerSelection& sel) {
  Dims d = dims(c);
  reference::SparseLayerWeights w = attention_weights(in);
  w.idx_wq = in.at("idx_wq");
  w.idx_wk = in.at("idx_wk");
  w.idx_w = in.at("idx_w");
  w.idx_kn_w = in.at("idx_k_norm_w");
  w.idx_kn_b = in.at("idx_k_norm_b");
  const IndexerDims x = indexer_dims(c);
  reference::DsaOut o = reference::dsa_layer(in.at("x"), in.get_or("ve", at::Tensor()), w, d.H, d.Hkv, d.dh,
                                             c.f("rope_base"), x.HI, x.DI, x.R, c.i("dsa_topk"), &sel);
  return {{"y", o.y}, {"aux_loss", o.aux_loss}};
}

// NeoX rotation by +θ (y1 = x1 cos − x2 sin, y2 = x2 cos + x1 sin) on the first R dims of x [B,T,…,D],
// at positions 0 … T − 1, or at `pos` (int64 [T] on x's device) when given (a decoded token).
at::Tensor rope_neox_partial(const at::Tensor& x, int64_t R, double base, const at::Tensor& pos = {}) {
  const int64_t T = x.size(1), half = R / 2;
  auto o64 = at::TensorOptions().dtype(at::kDouble).device(x.device());
  const at::Tensor at_pos = pos.defined() ? pos.to(at::kDouble).view({T, 1}) : at::arange(T, o64).view({T, 1});
  at::Tensor ang = at_pos * at::pow(base, -at::arange(half, o64) * (2.0 / double(R))).view({1, half});
  std::vector<int64_t> shape(size_t(x.dim()), 1);
  shape[1] = T;
  shape.back() = half;
  at::Tensor cs = ang.cos().to(x.scalar_type()).view(shape), sn = ang.sin().to(x.scalar_type()).view(shape);
  at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half), rest = x.narrow(-1, R, x.size(-1) - R);
  return at::cat({x1 * cs - x2 * sn, x2 * cs + x1 * sn, rest}, -1);
}

// The lightning indexer's query [B,T,H_I,d_I], key [B,T,d_I] and head weights [B,T,H_I] of the
// detached layer input, rotated at positions 0 … T − 1 or at `pos` (a decoded token).
struct IndexerIn {
  at::Tensor q, k, w;
};
IndexerIn indexer_inputs(const TensorMap& in, const Config& c, const at::Tensor& pos = {}) {
  const at::Tensor& x = in.at("x");
  // fp32 for half inputs (indexer_precision: the KL trains it there); prefill and decode the same, so
  // a decoded token selects as the forward does
  const auto ip = [&](const at::Tensor& t) { return indexer_precision(t, x); };
  const at::Tensor xd = ip(x.detach());
  const int64_t B = xd.size(0), T = xd.size(1);
  const auto [HI, DI, R] = indexer_dims(c);
  IndexerIn o;
  o.q = rope_neox_partial(at::linear(xd, ip(in.at("idx_wq"))).view({B, T, HI, DI}), R, c.f("rope_base"), pos);
  at::Tensor kr = at::linear(xd, ip(in.at("idx_wk")));
  at::Tensor ki = at::layer_norm(kr, {DI}, ip(in.at("idx_k_norm_w")), ip(in.at("idx_k_norm_b")), kIndexerLnEps);
  o.k = rope_neox_partial(ki.unsqueeze(2), R, c.f("rope_base"), pos).squeeze(2);
  o.w = at::linear(xd, ip(in.at("idx_w"))) * (1.0 / std::sqrt(double(HI) * double(DI)));
  return o;
}

}  // namespace

// The factor 4: on an H200 (gpu-d12, bf16, B = 1) the dense forms trained dsa 14 % faster at 2K (a
// row a sixteenth of the gathered keys) and 1.7× slower at 8K (a quarter).
bool dsa_dense_target(int64_t T, int64_t H, int64_t Hkv, int64_t dh, int64_t K) { return 4 * T * H < K * Hkv * dh; }
bool dsa_dense_student(int64_t T, int64_t HI, int64_t DI, int64_t K) { return 4 * HI * T < K * DI; }

namespace {

// The rows of a [B·T, ...] view that a selection sel [B,n,K] of keys 0..T−1 names (an empty slot, −1,
// names its batch's row 0).
at::Tensor selected_rows(const at::Tensor& sel, int64_t T) {
  return (sel.clamp_min(0) + at::arange(sel.size(0), sel.options()).view({-1, 1, 1}) * T).reshape({-1});
}

// The KL's student side, KL(p_t ‖ softmax over S_t of I_{t,·}) per token [B,T], one block of queries
// at a time in the forward and again in the backward: the selected indexer keys [B,n,K,d_I] and the
// scores [B,n,H_I,K] of one block exist at a time, and nothing per key is kept for the backward (the
// autograd form keeps [B,T,K,d_I]: 8.6 GB per layer at gpu-d12's 32 rows × 2048 tokens, K = 256, in
// fp32). The products are the autograd form's. qi [B,T,H_I,d_I], ki [B,T,d_I], wi [B,T,H_I] (with
// gradients), idx [B,T,K] (−1: an empty slot), p [B,T,K] (no gradient, 0 on empty slots).
// Or (dense, the form short contexts take) the block's scores against every key, [B,n,H_I,T], the
// selected columns gathered from them, and in the backward the columns' gradients scattered back
// into such rows for two GEMMs.
struct StudentKl : public torch::autograd::Function<StudentKl> {
  struct Block {
    at::Tensor sel, valid, flat, kig, s, I;  // the block's selection, keys, scores, student logits
    at::Tensor cols;                         // dense: the selected columns [B,n,H_I,K] (empty slots: 0)
  };
  static bool dense_form(const at::Tensor& qi, int64_t K, DsaScoreForm form) {
    if (form != DsaScoreForm::Auto) return form == DsaScoreForm::DenseScores;
    return dsa_dense_student(qi.size(1), qi.size(2), qi.size(3), K);
  }
  static int64_t rows_per_block(const at::Tensor& qi, int64_t K, int64_t budget_bytes, bool dense) {
    const int64_t B = qi.size(0), T = qi.size(1), HI = qi.size(2), DI = qi.size(3);
    const int64_t per_row = std::max<int64_t>(
        1, B * (dense ? 3 * HI * T + K * (4 * HI + 2) : K * (DI + 4 * HI)) * int64_t(qi.element_size()));
    return std::clamp<int64_t>(budget_bytes / per_row, 1, T);
  }
  static Block block(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& wi, const at::Tensor& idx, int64_t q0,
                     int64_t q1, bool dense) {
    const int64_t B = qi.size(0), T = qi.size(1), HI = qi.size(2), DI = qi.size(3), K = idx.size(2), n = q1 - q0;
    Block b;
    b.sel = idx.slice(1, q0, q1);
    b.valid = b.sel >= 0;
    if (dense) {
      b.cols = b.sel.clamp_min(0).unsqueeze(2).expand({B, n, HI, K});
      b.s = at::matmul(qi.slice(1, q0, q1), ki.transpose(-1, -2).unsqueeze(1)).gather(-1, b.cols);  // every key
    } else {
      b.flat = selected_rows(b.sel, T);
      b.kig = ki.reshape({B * T, DI}).index_select(0, b.flat).view({B, n, K, DI});
      b.s = at::matmul(qi.slice(1, q0, q1), b.kig.transpose(-1, -2));  // [B,n,HI,K]
    }
    b.I = at::matmul(wi.slice(1, q0, q1).unsqueeze(-2), at::relu(b.s)).squeeze(-2)
              .masked_fill(b.valid.logical_not(), -std::numeric_limits<double>::infinity());  // [B,n,K]
    return b;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qi, const at::Tensor& ki,
                            const at::Tensor& wi, const at::Tensor& idx, const at::Tensor& p, int64_t budget_bytes,
                            DsaScoreForm form) {
    c10::NoGradGuard ng;
    const int64_t T = qi.size(1), K = idx.size(2);
    const bool dense = dense_form(qi, K, form);
    const int64_t step = rows_per_block(qi, K, budget_bytes, dense);
    ctx->saved_data["budget"] = budget_bytes;
    ctx->saved_data["dense"] = dense;
    at::Tensor kl = at::empty({qi.size(0), T}, qi.options());
    for (int64_t q0 = 0; q0 < T; q0 += step) {
      const int64_t q1 = std::min(T, q0 + step);
      const Block b = block(qi, ki, wi, idx, q0, q1, dense);
      const at::Tensor logq = at::log_softmax(b.I, -1).masked_fill(b.valid.logical_not(), 0.0);
      const at::Tensor pl = p.slice(1, q0, q1);
      kl.slice(1, q0, q1).copy_((at::xlogy(pl, pl) - pl * logq).sum(-1));
    }
    ctx->save_for_backward({qi, ki, wi, idx, p});
    return kl;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    c10::NoGradGuard ng;
    const auto v = ctx->get_saved_variables();
    const at::Tensor &qi = v[0], &ki = v[1], &wi = v[2], &idx = v[3], &p = v[4];
    const int64_t B = qi.size(0), T = qi.size(1), HI = qi.size(2), DI = qi.size(3), K = idx.size(2);
    const bool dense = ctx->saved_data["dense"].toBool();
    const int64_t step = rows_per_block(qi, K, ctx->saved_data["budget"].toInt(), dense);
    at::Tensor dqi = at::empty_like(qi), dwi = at::empty_like(wi), dki = at::zeros({B * T, DI}, ki.options());
    for (int64_t q0 = 0; q0 < T; q0 += step) {
      const int64_t q1 = std::min(T, q0 + step), n = q1 - q0;
      const Block b = block(qi, ki, wi, idx, q0, q1, dense);
      const at::Tensor pl = p.slice(1, q0, q1);
      // d kl_t / d I_tj = softmax(I_t)_j · Σ_i p_ti − p_tj on the selected slots, 0 on the empty ones
      const at::Tensor gI = (at::softmax(b.I, -1) * pl.sum(-1, true) - pl)
                                .masked_fill_(b.valid.logical_not(), 0.0)
                                .mul_(g[0].slice(1, q0, q1).unsqueeze(-1));  // [B,n,K]
      const at::Tensor wb = wi.slice(1, q0, q1), qb = qi.slice(1, q0, q1);
      dwi.slice(1, q0, q1).copy_(at::matmul(at::relu(b.s), gI.unsqueeze(-1)).squeeze(-1));        // [B,n,HI]
      const at::Tensor ds = (wb.unsqueeze(-1) * gI.unsqueeze(-2)).masked_fill_(b.s <= 0, 0.0);  // [B,n,HI,K]
      if (dense) {
        // the columns' gradients in the block's rows of scores (distinct keys per row; an empty slot's is 0)
        const at::Tensor full = at::zeros({B, n, HI, T}, ds.options()).scatter_add_(-1, b.cols, ds);
        dqi.slice(1, q0, q1).copy_(at::matmul(full, ki.unsqueeze(1)));                             // [B,n,HI,DI]
        dki.view({B, T, DI}).add_(
            at::matmul(full.reshape({B, n * HI, T}).transpose(1, 2), qb.reshape({B, n * HI, DI})));  // [B,T,DI]
      } else {
        dqi.slice(1, q0, q1).copy_(at::matmul(ds, b.kig));                                         // [B,n,HI,DI]
        dki.index_add_(0, b.flat, at::matmul(ds.transpose(-1, -2), qb).reshape({-1, DI}));        // [B·n·K, DI]
      }
    }
    return {dqi, dki.view_as(ki), dwi, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// MIXBENCH_DSA_SCORE_FORM: auto (unset), gathered or dense: the form of the KL's scores
// (DsaScoreForm), to compare the two in a training sweep.
DsaScoreForm score_form() {
  const char* env = std::getenv("MIXBENCH_DSA_SCORE_FORM");
  if (!env || std::string(env) == "auto") return DsaScoreForm::Auto;
  if (std::string(env) == "gathered") return DsaScoreForm::Gathered;
  if (std::string(env) == "dense") return DsaScoreForm::DenseScores;
  throw InputError(fmt::format("MIXBENCH_DSA_SCORE_FORM must be auto, gathered or dense, not '{}'", env));
}

// The same code on every backend: the *_fast entry points pick the device's kernels.
TensorMap forward(const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend) {
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0), T = x.size(1);
  const double scale = 1.0 / std::sqrt(double(d.dh));
  QKV a = qkv(in, c);
  // Lightning indexer on the detached input, in fp32 for half inputs (indexer_precision).
  const IndexerIn ix = indexer_inputs(in, c);
  const at::Tensor &qi = ix.q, &ki = ix.k, &wi = ix.w;
  const bool warmup = full_attention_warmup(c, ctx);
  const int64_t K = warmup ? T : std::min(c.i("dsa_topk"), T);
  at::Tensor idx;
  if (warmup) {
    idx = causal_full_indices(B, T, x);
  } else {
    NvtxRange r(op_range("dsa_indexer"));
    idx = dsa_indexer_fast(qi.detach(), ki.detach(), wi.detach(), K, 1.0, /*relu=*/true);
  }
  at::Tensor o;
  {
    NvtxRange r(op_range("sparse_attention"));
    o = sparse_attention_fast(a.q, a.k, a.v, idx, scale);
  }
  at::Tensor y = at::linear(o.reshape({B, T, d.H * d.dh}), in.at("c_proj"));

  // Auxiliary KL over the selected keys.
  const DsaScoreForm form = score_form();
  const at::Tensor p = dsa_selected_attention_mean(a.q, a.k, idx, scale, int64_t(256) << 20, form);  // [B,T,K]
  const at::Tensor kl = dsa_student_kl(qi, ki, wi, idx, p.to(qi.scalar_type()), int64_t(256) << 20, form);  // [B,T]
  return {{"y", y}, {"aux_loss", kl.mean().to(y.scalar_type())}, {"selection", idx}};
}

// Decode cache (sparse_decode.h): "k", "v" [B,L,Hkv,dh] and the indexer keys "ik" [B,L,d_I].
TensorMap prefill(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend b) {
  at::Tensor y = forward(in, c, ctx, b).at("y");
  c10::NoGradGuard ng;
  const auto [a, rows] = sparse_decode::prefill_kv(in, cache, c);
  sparse_decode::store(cache, "ik", indexer_inputs(in, c).k, rows);
  return {{"y", y}};
}

// One token at the cache's position p: the indexer scores I[s] against the keys s ≤ p of the buffer
// (fp32 for half-precision layers, as dsa_indexer_fast), keys s > p masked to −inf, the top
// min(dsa_topk, L) by descending score with ties to the lower key, the slots past the p + 1 visible
// keys −1 (dsa_indexer's rule); attention over the chosen keys.
TensorMap decode(const TensorMap& in, TensorMap& cache, const Config& c, const LayerCtx& ctx, Backend) {
  c10::NoGradGuard ng;
  Dims d = dims(c);
  const at::Tensor& x = in.at("x");
  const sparse_decode::Step st = sparse_decode::begin_step(cache, x);
  const int64_t B = x.size(0), L = st.rows;
  const auto [HI, DI, R] = indexer_dims(c);
  QKV a = sparse_decode::qkv_at(in, c, st.pos);
  const IndexerIn ix = indexer_inputs(in, c, st.pos);
  sparse_decode::put(cache, "k", a.k, st.pos, L);
  sparse_decode::put(cache, "v", a.v, st.pos, L);
  sparse_decode::put(cache, "ik", ix.k, st.pos, L);
  at::Tensor sel;
  {
    NvtxRange r(op_range("dsa_indexer"));
    // Σ_h w_h·relu(q_h·k_s) over the keys s ≤ p (sparse_decode::row_scores: 0 past p; the cached
    // keys converted to fp32 as they are read)
    const at::Tensor q = up_to_fp32(ix.q).view({B, 1, HI, DI}), w = up_to_fp32(ix.w).view({B, 1, HI});
    at::Tensor score = sparse_decode::row_scores(q, cache.at("ik").view({B, L, 1, DI}), st.pos, 1, w);  // [B,1,L]
    const at::Tensor future = at::arange(L, st.pos.options()).view({1, 1, L}) > st.pos.view({1, 1, 1});
    score = score.masked_fill(future, -std::numeric_limits<double>::infinity());
    const int64_t K = full_attention_warmup(c, ctx) ? L : std::min(c.i("dsa_topk"), L);
    sel = score.scalar_type() == at::kFloat
              ? topk_lowest_index(score, K)
              : std::get<1>(at::sort(score, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).narrow(-1, 0, K);
    sel = sel.masked_fill(sel > st.pos.view({1, 1, 1}), -1);  // [B,1,K]
  }
  const at::Tensor& K = cache.at("k");
  const at::Tensor& V = cache.at("v");
  at::Tensor o = sparse_decode::attend_keys(a.q.view({B, d.H, d.dh}), K, V, sel, sel >= 0, 1.0 / std::sqrt(double(d.dh)));
  sparse_decode::end_step(cache, st);
  return {{"y", at::linear(o.view({B, 1, d.H * d.dh}), in.at("c_proj"))}};
}

// Indexer (query, key) pairs per token dsa_indexer scores: each block of kDsaIndexerQueryBlock
// queries against every key up to the block's end.
double indexer_pairs(int64_t T) {
  double pairs = 0;
  for (int64_t q0 = 0; q0 < T; q0 += kDsaIndexerQueryBlock) {
    const int64_t q1 = std::min(T, q0 + kDsaIndexerQueryBlock);
    pairs += double(q1 - q0) * double(q1);
  }
  return pairs / double(T);
}

// Per token at length T, K = min(topk, T) index slots, P = indexer pairs per token (above):
//   matmul params N = attention's N_l + H_I·d_I·d + d_I·d + H_I·d
//   fwd = 2N + 2·(H_I·d_I + H_I)·P      (indexer scores over the full history, head-weighted sum)
//       + 4·H·dh·K                      (sparse attention, every slot computed)
//       + 2·H·dh·K_t                    (teacher: main logits over K_t keys, recomputed: the selected
//                                        ones, or every key in the dense form, K_t = T)
//       + 2·H_I·d_I·K_s + 2·H_I·K       (student: indexer scores over K_s keys (K, or T in the dense
//                                        form), the head-weighted sum over the selected ones)
//   nanochat training core = 12·H·dh·K + 2·(H_I·d_I + H_I)·T (indexer forward only, no causal
//       halving) + 2·H·dh·K + 6·(H_I·d_I + H_I)·K (teacher forward; student forward and backward)
//   decode at context c = 2N + 2·(H_I·d_I + H_I)·c + 4·H·dh·min(k, c)
//   cache per token = main KV (2·Hkv·dh) + the indexer key (d_I) elements; a decode step reads
//       d_I·c + 2·Hkv·dh·min(k, c) of them
//   indexer's training FLOPs (its share of the layer's 6N + core) = 6·N_I + 2·(H_I·d_I + H_I)·T
//       + 6·(H_I·d_I + H_I)·K, N_I = H_I·d_I·d + d_I·d + H_I·d its matmul params
// The indexer's part of the layer's training FLOPs per token (see account).
double indexer_train_flops(const Config& c, const LayerCtx&, const CostQuery& q) {
  const Dims d = dims(c);
  const auto [HI, DI, R] = indexer_dims(c);
  const double ix = double(HI * DI + HI), K = double(std::min(c.i("dsa_topk"), q.T));
  return 6.0 * double(HI * DI * d.D + DI * d.D + HI * d.D) + 2.0 * ix * double(q.T) + 6.0 * ix * K;
}

LayerCost account(const Config& c, const LayerCtx& ctx, const CostQuery& q) {
  Dims d = dims(c);
  const auto [HI, DI, R] = indexer_dims(c);
  const int64_t topk = c.i("dsa_topk");
  const int64_t K = std::min(topk, q.T);
  LayerCost lc;
  const int64_t N = attention_matmul_params(c, ctx) + HI * DI * d.D + DI * d.D + HI * d.D;
  lc.params.transformer_matrices = N;
  lc.params.matmul = N;
  lc.params.scalars = 2 * DI;
  const double hd = double(d.H * d.dh), ix = double(HI * DI + HI);
  // the KL's two sides in the form the layer takes at this length (dsa_dense_target / _student:
  // every key's score, then the selected columns, or the selected keys' alone)
  const double teacher_keys = double(dsa_dense_target(q.T, d.H, d.Hkv, d.dh, K) ? q.T : K);
  const double student_keys = double(dsa_dense_student(q.T, HI, DI, K) ? q.T : K);
  lc.fwd_flops = 2.0 * double(N) + 2.0 * ix * indexer_pairs(q.T) + 4.0 * hd * double(K) + 2.0 * hd * teacher_keys +
                 2.0 * double(HI * DI) * student_keys + 2.0 * double(HI) * double(K);
  lc.nanochat_core_flops = 12.0 * hd * double(K) + 2.0 * ix * double(q.T) + 2.0 * hd * double(K) + 6.0 * ix * double(K);
  lc.decode_flops = 2.0 * double(N) + 2.0 * ix * double(q.context) + 4.0 * hd * double(std::min(topk, q.context));
  lc.cache_bytes_per_token = double(2 * d.Hkv * d.dh + DI) * double(q.dtype_bytes);
  // a decode step reads every indexer key and the selected keys' K and V
  lc.decode_read_bytes = double(DI * q.context + 2 * d.Hkv * d.dh * std::min(topk, q.context)) * double(q.dtype_bytes);
  lc.act_bytes = double(q.dtype_bytes) * double(d.D + 2 * d.H * d.dh + 4 * d.Hkv * d.dh + d.H * d.dh + HI * DI + DI) +
                 4.0 * double(d.H);
  lc.formula = fmt::format("DSA top-{} (H_I={}, d_I={}, rope {}): fwd 2N + 2·(H_I·d_I+H_I)·P(T) + 4·H·dh·K + 2·H·dh·K_t + "
                           "2·H_I·d_I·K_s + 2·H_I·K, K = min({},T), K_t = {}, K_s = {} (the KL's score forms)",
                           topk, HI, DI, R, topk, teacher_keys, student_keys);
  return lc;
}

std::vector<CaseDef> cases(const ConfigSpec& spec) {
  // A 4-layer model, d=64, 4 heads of 16; indexer 3 heads of 8 (4 rotary dims), top-12 keys.
  Config base = spec.parse(
      "n_layer=4,d_model=64,head_dim=16,seq_len=64,vocab=64,dsa_topk=12,idx_heads=3,idx_dim=8,idx_rope_dim=4");
  return {
      {"layer0_T1", base, 1, 1, 0},
      {"layer0_T9_all_selected", base, 2, 9, 0},
      {"layer0_B2_T37", base, 2, 37, 0},
      {"layer1_ve_B2_T45", base, 2, 45, 1},
      {"layer3_last_ve_gqa_T29", base.with("kv_ratio", int64_t(2)), 1, 29, 3},
      {"layer2_mqa_T33", base.with("kv_ratio", int64_t(0)), 1, 33, 2},
      {"layer2_top20_full_rope_T70", base.with("dsa_topk", int64_t(20)).with("idx_rope_dim", int64_t(8)), 1, 70, 2},
      // the size rule: 4 heads of 16 give an indexer of 2 heads of 16 with 8 rotary dims
      {"layer1_rule_sized_indexer_T33",
       base.with("idx_heads", int64_t(0)).with("idx_dim", int64_t(0)).with("idx_rope_dim", int64_t(-1)), 2, 33, 1},
  };
}

MethodSpec make_spec() {
  SparseMethodDesc d;
  d.name = "dsa";
  d.summary = "DSA: lightning indexer (H/2 ReLU heads of head_dim, signed weights, LayerNorm'd key, partial RoPE) picks top-256 keys; KL aux loss";
  d.citation = "DeepSeek-V3.2-Exp inference/model.py Indexer (arXiv 2512.02556); nanochat attention layer";
  d.warmup = true;
  d.knobs = [](ConfigSpec& s) {
    s.i("dsa_topk", 256, "keys selected per query", 1)
        .i("idx_heads", 0, "indexer heads H_I; 0 = max(1, n_head/2) (V3.2: 64 for 128 attention heads)", 0)
        .i("idx_dim", 0, "indexer head dim d_I; 0 = head_dim (V3.2: 128, its attention's head dim)", 0)
        .i("idx_rope_dim", -1, "rotary dims of the indexer heads (first ones, NeoX style); -1 = d_I/2 rounded down to even", -1)
        .rule([](const Config& c) {
          if (c.i("idx_dim") == 1) throw InputError("idx_dim 1 is too small: use 0 (head_dim) or at least 2");
          const IndexerDims x = indexer_dims(c);
          if (x.R % 2 != 0 || x.R > x.DI)
            throw InputError(fmt::format("idx_rope_dim {} must be even and at most the indexer head dim {}", x.R, x.DI));
        });
  };
  d.ops = {"dsa_indexer", "sparse_attention"};
  d.params = params;
  d.reference = reference_fn;
  d.forward = forward;
  d.account = account;
  d.cases = cases;
  d.prefill = prefill;
  d.decode = decode;
  MethodSpec m = sparse_method(d);
  // Training presets: the dense warm-up (512 steps by default) would cover all of small's 40 steps:
  // a quarter of them. 32 of tiny's 128 keys per query, a quarter of small's 512; the indexer
  // follows the size rule (tiny: 2 heads of 32, small: 3 of 64, gpu-d12: 3 of 128).
  m.presets["tiny"].config = "dsa_topk=32";
  m.presets["small"].config = "full_attention_warmup_frac=0.25,dsa_topk=128";
  // gpu-d12: the warm-up a quarter of the run; with no CUDA kernel, the LibTorch path's index scores
  // for 32 rows × 2048² need more than an H200's memory: micro-batches of 4 rows.
  m.presets["gpu-d12"] = {"full_attention_warmup_frac=0.25", 4};
  return m;
}

MIXBENCH_REGISTER(make_spec());
MIXBENCH_REGISTER_COST_PART("dsa", "indexer", indexer_train_flops);

}  // namespace

// The selected keys are copied out per block of queries, [B,n,K,Hkv,dh], not for every query at once
// ([B,T,K,Hkv,dh]: 12.9 GB per layer at T = 32K, K = 256 in bf16); the same products as one copy.
// Or, at short contexts, the block's scores against every visible key in one GEMM and the selected
// columns gathered from them.
at::Tensor dsa_selected_attention_mean(const at::Tensor& q, const at::Tensor& k, const at::Tensor& idx, double scale,
                                       int64_t budget_bytes, DsaScoreForm form) {
  c10::NoGradGuard ng;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dh = q.size(3), Hkv = k.size(2), G = H / Hkv, K = idx.size(2);
  const bool half = layers::is_half(q);
  at::Tensor out = at::empty({B, T, K}, q.options().dtype(half ? at::kFloat : q.scalar_type()));
  const at::Tensor qd = q.detach();
  const int64_t esize = int64_t(k.element_size());
  if (form == DsaScoreForm::Auto) form = dsa_dense_target(T, H, Hkv, dh, K) ? DsaScoreForm::DenseScores : DsaScoreForm::Gathered;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (form == DsaScoreForm::DenseScores) {
    // per query: its row of scores against every key (in the inputs' dtype and in fp32; every key,
    // not only those up to the block's last, so that the work per token is H·dh·T whatever the
    // blocks: what the accountant bills), the gathered selection and its softmax
    const int64_t per_row = std::max<int64_t>(1, B * H * (T * (esize + 4) + K * 12));
    const int64_t block = std::clamp<int64_t>(budget_bytes / per_row, 1, T);
    const at::Tensor kt = k.detach().permute({0, 2, 3, 1}).unsqueeze(2);  // [B,Hkv,1,dh,T]
    for (int64_t q0 = 0; q0 < T; q0 += block) {
      const int64_t q1 = std::min(T, q0 + block), n = q1 - q0;
      const at::Tensor sel = idx.slice(1, q0, q1);                                            // [B,n,K]
      const at::Tensor qb = qd.slice(1, q0, q1).reshape({B, n, Hkv, G, dh}).permute({0, 2, 3, 1, 4});  // [B,Hkv,G,n,dh]
      const at::Tensor s = at::matmul(qb, kt) * scale;                                        // [B,Hkv,G,n,T]
      const at::Tensor cols = sel.clamp_min(0).view({B, 1, 1, n, K}).expand({B, Hkv, G, n, K});
      at::Tensor lg = s.gather(-1, cols).masked_fill((sel < 0).view({B, 1, 1, n, K}), neg_inf);  // [B,Hkv,G,n,K]
      out.slice(1, q0, q1).copy_(at::softmax(half ? lg.to(at::kFloat) : lg, -1).sum({1, 2}).div_(double(H)));
    }
    return out;
  }
  const at::Tensor kf = k.detach().reshape({B * T, Hkv, dh});
  // per query: its keys and the scores (also in fp32 for half inputs)
  const int64_t per_row = std::max<int64_t>(1, B * K * (Hkv * dh * esize + H * 8));
  const int64_t block = std::clamp<int64_t>(budget_bytes / per_row, 1, T);
  for (int64_t q0 = 0; q0 < T; q0 += block) {
    const int64_t q1 = std::min(T, q0 + block), n = q1 - q0;
    const at::Tensor sel = idx.slice(1, q0, q1);  // [B,n,K]
    const at::Tensor kg = kf.index_select(0, selected_rows(sel, T)).view({B, n, K, Hkv, dh});
    at::Tensor lg = at::matmul(qd.slice(1, q0, q1).reshape({B, n, Hkv, G, dh}), kg.permute({0, 1, 3, 4, 2})) * scale;
    lg = lg.masked_fill((sel < 0).view({B, n, 1, 1, K}), neg_inf);
    out.slice(1, q0, q1).copy_(at::softmax(half ? lg.to(at::kFloat) : lg, -1).sum({2, 3}).div_(double(H)));
  }
  return out;
}


at::Tensor dsa_student_kl(const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& wi, const at::Tensor& idx,
                          const at::Tensor& p, int64_t budget_bytes, DsaScoreForm form) {
  return StudentKl::apply(qi, ki, wi, idx, p, budget_bytes, form);
}

}  // namespace mixbench
