// residual_standard, hc and mhc: dense_full's model with its residual stream replaced
// (methods.md §5; method-details.md "Residual streams"; seed 001, 完整注意力基线与残差连接).
//
//   residual_standard  one stream, h ← h + F(norm(h)) for every attention and MLP sublayer; VE,
//                      smear, embeddings and the ReLU² MLP kept, nanochat's resid/x0 lambdas and
//                      backout dropped.
//   hc                 dynamic Hyper-Connections (arXiv 2409.19606, Eq. 10–14), n streams H [n,d]
//                      started as n copies of the embedding. Sublayer k (attention and MLP of each
//                      plan step: k = 2·step + {0, 1}) with H̄ = RMSNorm(H) per stream:
//                        B   = s_β·tanh(H̄W_β)ᵀ + B₀        [1,n]
//                        A_m = s_α·tanh(H̄W_m)  + A_m0       [n,1]
//                        A_r = s_α·tanh(H̄W_r)  + A_r0       [n,n]
//                        h₀ = A_mᵀH (the sublayer's input, before its RMSNorm); Ĥ = Bᵀ·F(h₀) + A_rᵀH.
//                      Init W = 0, s_α = s_β = 0.01, B₀ = 1, A_m0 = e_(k mod n), A_r0 = I.
//   mhc                mHC (arXiv 2512.24880, Eq. 7–9), n streams x [n,C]: x' = RMSNorm(vec(x))
//                      over all n·C, one projection x'φ to n + n + n² logits,
//                        H_pre = σ(α_pre·(x'φ_pre) + b_pre), H_post = 2σ(α_post·(x'φ_post) + b_post),
//                        H_res = Sinkhorn–Knopp(exp(α_res·mat(x'φ_res) + b_res)),
//                      input H_pre·x, update x ← H_res·x + H_postᵀ·F(H_pre·x). φ = 0 and α = 0.01 at
//                      init, biases HC's static values (b_pre = e_(k mod n), b_post = 1, b_res = I),
//                      the coefficients computed in at least FP32.
//
// Parameters (all stream-owned, group Scalar, AdamW group "residual_maps" without weight decay,
// one slice per sublayer k of the plan's 2·n_steps):
//   hc.static [K,n,n+2]   static coefficients, columns (B₀, A_m0, A_r0 row by row), stored as the
//                         offset from HC's init above (init 0: the effective value is init + offset,
//                         which trains exactly as the value itself under AdamW without decay)
//   hc.scale [K,2]        s_β, s_α (init 0.01)
//   hc.dynamic.<k> [n+2,d] W_β, W_m, W_r as the rows of one projection (init 0)
//   mhc.alpha [K,3]       α_pre, α_post, α_res (init 0.01)
//   mhc.bias [K,2n+n²]    b_pre, b_post, b_res as the offset from HC's static values (init 0)
//   mhc.proj.<k> [2n+n²,n·d] φ_pre, φ_post, φ_res as rows (init 0)
// The projections are matmul parameters (ParamDef::matmul): the accountant's 2·N counts one
// application per token; hc applies its projection to each of the n streams, so its stream bills
// the other n − 1.
// Read-out (hc and mhc): the streams' sum before the final norm, taken as their mean — a constant
// factor 1/n that the final RMSNorm removes except for its eps, so that hc at init computes
// residual_standard exactly (to rounding) rather than up to the eps.
//
// Each stream has two arithmetic paths: Backend::Reference keeps the n streams as separate
// tensors and writes every dot product, combination and Sinkhorn step as an explicit loop over
// streams (FP64 in the harness's reference passes); the fast path holds H [B,T,n,d] and uses
// batched matrix products.
#include "mixers/residual/streams.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include <vector>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "mixers/common/layers.h"
#include "mixers/residual/residual_common.h"

namespace mixbench::residual {
namespace {

using Tensors = std::vector<at::Tensor>;

// Coefficients in at least FP32 (FP32 when the compute dtype is bf16/fp16).
at::ScalarType coef_dtype(const at::Tensor& x) { return at::promote_types(x.scalar_type(), at::kFloat); }

int64_t n_sublayers(const ExecPlan& plan) { return 2 * plan.n_steps(); }

std::string key(const char* what, int64_t i) { return fmt::format("{}.{}", what, i); }
std::string key(const char* what, int64_t i, int64_t j) { return fmt::format("{}.{}.{}", what, i, j); }

// HC's static coefficients of sublayer k as one [n, n+2] matrix: column 0 B₀ = 1, column 1
// A_m0 = e_(k mod n), columns 2.. A_r0 = I (fast path).
at::Tensor hc_init(int64_t n, int64_t k, const at::TensorOptions& o) {
  at::Tensor s = at::zeros({n, n + 2}, o);
  s.select(1, 0).fill_(1.0);
  s.select(1, 1)[k % n].fill_(1.0);
  s.narrow(1, 2, n).copy_(at::eye(n, o));
  return s;
}
// Entry (i, c) of the same matrix (reference).
double hc_init_entry(int64_t n, int64_t k, int64_t i, int64_t c) {
  if (c == 0) return 1.0;
  if (c == 1) return i == k % n ? 1.0 : 0.0;
  return i == c - 2 ? 1.0 : 0.0;
}

// Per token, per sublayer, in the fast path's matrix products (FlopCounter sees them) and its
// element-wise work (it does not): the n-stream combinations of read and write are common to hc
// and mhc — the input (2·n·d), the stream mix (2·n²·d), the output spread over the streams
// (2·n·d) and the final add (n·d) — as are the RMSNorm over n·d entries (3·n·d: square, sum,
// scale) and the read-out (n·d per token once).
double combine_matmul_flops(int64_t n, int64_t d) { return 2.0 * n * d + 2.0 * n * n * d + 2.0 * n * d; }
double combine_elementwise_flops(int64_t n, int64_t d) { return 3.0 * n * d + n * d; }

// n parallel streams started as n copies of the embedding. A sublayer's read (the subclass's)
// leaves in the state the write's coefficients: "out" [B,T,n] (the weight of the sublayer's output
// on each stream) and "mix" [B,T,n,n]; write sets H ← mix·H + out ⊗ y. The read-out is the
// streams' mean. Reference states hold each stream ("H.<i>") and coefficient ("out.<i>",
// "mix.<i>.<j>") as its own tensor.
class MultiStream : public ResidualStream {
 public:
  explicit MultiStream(int64_t n) : n_(n) {}
  // a token's streams and maps are its own (nothing across positions, nothing read on the host)
  bool static_decode() const override { return true; }

  // Fast path: the streams and their combinations in the coefficients' dtype (at least FP32; a
  // sublayer reads its input rounded to the compute dtype once), so that neither n-term
  // combinations of nearly parallel streams nor the streams themselves carry a rounding per term
  // in half precision. "like" keeps the compute dtype.
  TensorMap begin(const at::Tensor& x, const TensorMap&, Backend b) const override {
    TensorMap st;
    if (b == Backend::Reference) {
      for (int64_t i = 0; i < n_; ++i) st.set(key("H", i), x);
    } else {
      st.set("H", x.to(coef_dtype(x)).unsqueeze(-2).expand({x.size(0), x.size(1), n_, x.size(2)}));
      st.set("like", x.new_empty({0}));
    }
    return st;
  }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.backend == Backend::Reference) return read_reference(st, s, P);
    const at::Tensor H = st.at("H");  // a handle: read_fast adds entries to the state
    return read_fast(st, H, s.index(), P).to(st.at("like").scalar_type());
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap&) const override {
    if (s.backend == Backend::Reference) {
      // H_i ← out_i·y + Σ_j mix[i,j]·H_j
      Tensors H(static_cast<size_t>(n_));
      // coefficients in the streams' dtype (the Sinkhorn iterates may be wider)
      for (int64_t i = 0; i < n_; ++i) {
        at::Tensor h = st.at(key("out", i)).to(y.scalar_type()).unsqueeze(-1) * y;
        for (int64_t j = 0; j < n_; ++j)
          h = h + st.at(key("mix", i, j)).to(y.scalar_type()).unsqueeze(-1) * st.at(key("H", j));
        H[size_t(i)] = h;
      }
      for (int64_t i = 0; i < n_; ++i) st.set(key("H", i), H[size_t(i)]);
      return;
    }
    const at::Tensor H = st.at("H");
    st.set("H", at::matmul(st.at("mix"), H) + at::matmul(st.at("out").unsqueeze(-1), y.to(H.scalar_type()).unsqueeze(-2)));
  }

  at::Tensor finish(TensorMap& st, const TensorMap&, Backend b) const override {
    if (b != Backend::Reference) return (st.at("H").sum(-2) / double(n_)).to(st.at("like").scalar_type());
    at::Tensor sum = st.at(key("H", 0));
    for (int64_t i = 1; i < n_; ++i) sum = sum + st.at(key("H", i));
    return sum / double(n_);
  }

  // The stream's FLOPs per token: per sublayer `map_matmul` (matrix products beyond 2·N) and
  // `map_elementwise` besides the combinations above.
  double stream_fwd_flops(const ModelDims& d, const ExecPlan& plan, double map_matmul, double map_elementwise) const {
    return double(n_sublayers(plan)) * (map_matmul + combine_matmul_flops(n_, d.d_model)) +
           stream_uncounted_flops(d, plan, map_elementwise);
  }
  double stream_uncounted_flops(const ModelDims& d, const ExecPlan& plan, double map_elementwise) const {
    return double(n_sublayers(plan)) * (map_elementwise + combine_elementwise_flops(n_, d.d_model)) +
           double(n_ * d.d_model);
  }
  // Activations kept for backward per sublayer beyond the backbone's: the n streams and their
  // normalised copy (2·n·d in the coefficients' dtype, at least FP32) and `coef` coefficients.
  double stream_act_bytes(const ModelDims& d, const ExecPlan& plan, double coef, int64_t dtype_bytes) const {
    const double cb = double(std::max<int64_t>(dtype_bytes, 4));
    return double(n_sublayers(plan)) * (2.0 * n_ * d.d_model * cb + cb * coef);
  }

 protected:
  // Sublayer k's input from the streams H [B,T,n,d]; sets "out" and "mix".
  virtual at::Tensor read_fast(TensorMap& st, const at::Tensor& H, int64_t k, const TensorMap& P) const = 0;
  virtual at::Tensor read_reference(TensorMap& st, const Sublayer& s, const TensorMap& P) const = 0;
  int64_t n_;
};

// ------------------------------------------------------------------ residual_standard
class StandardStream final : public ResidualStream {
 public:
  std::string name() const override { return "standard"; }
  bool static_decode() const override { return true; }
  std::vector<ParamDef> params(const ModelDims&, const ExecPlan&) const override { return {}; }
  TensorMap begin(const at::Tensor& x, const TensorMap&, Backend) const override { return TensorMap{{"h", x}}; }
  at::Tensor read(TensorMap& st, const Sublayer&, const TensorMap&) const override { return st.at("h"); }
  void write(TensorMap& st, const Sublayer&, const at::Tensor& y, const TensorMap&) const override {
    st.set("h", st.at("h") + y);
  }
  at::Tensor finish(TensorMap& st, const TensorMap&, Backend) const override { return st.at("h"); }
};

// ------------------------------------------------------------------ hc
class HcStream final : public MultiStream {
 public:
  explicit HcStream(int64_t n) : MultiStream(n) {
    if (n < 1) throw InputError(fmt::format("hc needs at least one stream (streams = {})", n));
  }
  std::string name() const override { return "hc"; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    const int64_t K = n_sublayers(plan), n = n_;
    std::vector<ParamDef> p = {
        {"hc.static", {K, n, n + 2}, ParamGroup::Scalar, false, "const", 0.0, 0, residual_map_rule()},
        {"hc.scale", {K, 2}, ParamGroup::Scalar, false, "const", 0.01, 0, residual_map_rule()},
    };
    for (int64_t k = 0; k < K; ++k)
      p.push_back({key("hc.dynamic", k), {n + 2, d.d_model}, ParamGroup::Scalar, true, "const", 0.0, 0, residual_map_rule()});
    return p;
  }

  // Per sublayer: the map projection on the n − 1 streams that 2·N does not bill,
  // 2·(n−1)·d·(n+2), in matrix products; tanh, scale and offset of the n(n+2) coefficients (3
  // each) element-wise.
  double fwd_flops(const ModelDims& d, const ExecPlan& plan) const override {
    return stream_fwd_flops(d, plan, 2.0 * (n_ - 1) * d.d_model * (n_ + 2), 3.0 * n_ * (n_ + 2));
  }
  double uncounted_flops(const ModelDims& d, const ExecPlan& plan) const override {
    return stream_uncounted_flops(d, plan, 3.0 * n_ * (n_ + 2));
  }
  double act_bytes(const ModelDims& d, const ExecPlan& plan, int64_t dtype_bytes) const override {
    return stream_act_bytes(d, plan, double(n_ * (n_ + 2)), dtype_bytes);
  }

 private:
  // coefficients [B,T,n,n+2] = scale ⊙ tanh(H̄W) + init + offset, columns (B, A_m, A_r).
  at::Tensor read_fast(TensorMap& st, const at::Tensor& H, int64_t k, const TensorMap& P) const override {
    const int64_t n = n_;
    const at::ScalarType cd = coef_dtype(H);
    const at::TensorOptions co = H.options().dtype(cd);
    const at::Tensor Hn = layers::rms_norm(H);
    const at::Tensor dyn = at::tanh(at::linear(Hn, P.at(key("hc.dynamic", k)).to(cd)));
    const at::Tensor sc = P.at("hc.scale")[k].to(cd);
    const at::Tensor col_scale = at::cat({sc.slice(0, 0, 1), sc.slice(0, 1, 2).expand({n + 1})});
    const at::Tensor coef = dyn * col_scale + (hc_init(n, k, co) + P.at("hc.static")[k].to(cd));
    st.set("out", coef.select(-1, 0));                           // B
    st.set("mix", coef.narrow(-1, 2, n).transpose(-1, -2));      // A_rᵀ
    return at::matmul(coef.select(-1, 1).unsqueeze(-2), H).squeeze(-2);  // A_mᵀH
  }

  at::Tensor read_reference(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    const int64_t k = s.index(), n = n_;
    const at::Tensor W = P.at(key("hc.dynamic", k)), S = P.at("hc.static")[k], sc = P.at("hc.scale")[k];
    at::Tensor h0;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor Hi = st.at(key("H", i));
      const at::Tensor Hn = reference_rms_norm(Hi);
      // coefficient c of stream i: scale_c·tanh(H̄_i·W[:,c]) + init + offset
      auto coef = [&](int64_t c) {
        const at::Tensor scale = c == 0 ? sc[0] : sc[1];
        return scale * at::tanh((Hn * W[c]).sum(-1)) + (hc_init_entry(n, k, i, c) + S[i][c]);
      };
      st.set(key("out", i), coef(0));
      const at::Tensor term = coef(1).unsqueeze(-1) * Hi;
      h0 = h0.defined() ? h0 + term : term;
      for (int64_t j = 0; j < n; ++j) st.set(key("mix", j, i), coef(2 + j));  // A_r[i,j] = (A_rᵀ)[j,i]
    }
    return h0;
  }
};

// ------------------------------------------------------------------ mhc
class MhcStream final : public MultiStream {
 public:
  MhcStream(int64_t n, int64_t iters) : MultiStream(n), iters_(iters) {
    if (n < 1) throw InputError(fmt::format("mhc needs at least one stream (streams = {})", n));
    if (iters < 1) throw InputError(fmt::format("mhc needs at least one Sinkhorn–Knopp iteration (sinkhorn_iters = {})", iters));
  }
  std::string name() const override { return "mhc"; }
  int64_t n_logits() const { return 2 * n_ + n_ * n_; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    const int64_t K = n_sublayers(plan);
    std::vector<ParamDef> p = {
        {"mhc.alpha", {K, 3}, ParamGroup::Scalar, false, "const", 0.01, 0, residual_map_rule()},
        {"mhc.bias", {K, n_logits()}, ParamGroup::Scalar, false, "const", 0.0, 0, residual_map_rule()},
    };
    for (int64_t k = 0; k < K; ++k)
      p.push_back({key("mhc.proj", k), {n_logits(), n_ * d.d_model}, ParamGroup::Scalar, true, "const", 0.0, 0,
                   residual_map_rule()});
    return p;
  }

  // Per sublayer: no matrix product beyond 2·N (the projection's 2·n·d·(2n+n²) is 2·N's);
  // element-wise the scale and offset of the 2n+n² logits (2 each), the sigmoids (3 each, +1 for
  // H_post's factor 2), exp of n² entries and per Sinkhorn iteration two log-domain
  // normalisations of n² entries (4 each: exp, sum, log, subtract).
  double map_elementwise() const {
    return 2.0 * n_logits() + 3.0 * 2 * n_ + n_ + double(n_ * n_) + 8.0 * double(iters_) * n_ * n_;
  }
  double fwd_flops(const ModelDims& d, const ExecPlan& plan) const override {
    return stream_fwd_flops(d, plan, 0.0, map_elementwise());
  }
  double uncounted_flops(const ModelDims& d, const ExecPlan& plan) const override {
    return stream_uncounted_flops(d, plan, map_elementwise());
  }
  // coefficients: the logits, H_pre, H_post and every Sinkhorn iterate (2 per iteration)
  double act_bytes(const ModelDims& d, const ExecPlan& plan, int64_t dtype_bytes) const override {
    return stream_act_bytes(d, plan, double(n_logits()) + 2.0 * n_ + 2.0 * double(iters_) * n_ * n_, dtype_bytes);
  }

 private:
  at::Tensor read_fast(TensorMap& st, const at::Tensor& H, int64_t k, const TensorMap& P) const override {
    const int64_t n = n_;
    const at::ScalarType cd = coef_dtype(H);
    const at::TensorOptions co = H.options().dtype(cd);
    const at::Tensor xn = layers::rms_norm(H.flatten(-2));  // [B,T,n·d]
    const at::Tensor logits = at::linear(xn, P.at(key("mhc.proj", k)).to(cd));
    const at::Tensor a = P.at("mhc.alpha")[k].to(cd);
    const at::Tensor col_scale = at::cat({a.slice(0, 0, 1).expand({n}), a.slice(0, 1, 2).expand({n}),
                                          a.slice(0, 2, 3).expand({n * n})});
    const at::Tensor init = hc_init(n, k, co);  // b_pre = A_m0, b_post = B₀, b_res = A_r0
    const at::Tensor bias = at::cat({init.select(1, 1), init.select(1, 0), init.narrow(1, 2, n).flatten()}) +
                            P.at("mhc.bias")[k].to(cd);
    const at::Tensor z = logits * col_scale + bias;
    const at::Tensor pre = at::sigmoid(z.narrow(-1, 0, n));
    st.set("out", 2.0 * at::sigmoid(z.narrow(-1, n, n)));  // H_post
    auto shape = z.sizes().vec();
    shape.back() = n;
    shape.push_back(n);
    st.set("mix", sinkhorn(z.narrow(-1, 2 * n, n * n).reshape(shape), iters_));
    return at::matmul(pre.unsqueeze(-2), H).squeeze(-2);  // H_pre·x
  }

  at::Tensor read_reference(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    const int64_t k = s.index(), n = n_;
    const at::Tensor phi = P.at(key("mhc.proj", k)), a = P.at("mhc.alpha")[k], b = P.at("mhc.bias")[k];
    // RMSNorm over the flattened n·d entries
    at::Tensor sq;
    int64_t D = 0;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor Hi = st.at(key("H", i));
      const at::Tensor t = (Hi * Hi).sum(-1);
      sq = sq.defined() ? sq + t : t;
      D = Hi.size(-1);
    }
    const at::Tensor inv = 1.0 / at::sqrt(sq / double(n * D) + kRmsEps);
    // logit c = α_g(c)·Σ_i ⟨x'_i, φ_c[i·d : (i+1)·d]⟩ + HC's static value + offset
    auto logit = [&](int64_t c, int64_t group, double init) {
      at::Tensor dot;
      for (int64_t i = 0; i < n; ++i) {
        const at::Tensor t = (st.at(key("H", i)) * phi[c].narrow(0, i * D, D)).sum(-1);
        dot = dot.defined() ? dot + t : t;
      }
      return a[group] * (dot * inv) + (init + b[c]);
    };
    at::Tensor h_in;
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor pre = 1.0 / (1.0 + at::exp(-logit(i, 0, hc_init_entry(n, k, i, 1))));
      st.set(key("out", i), 2.0 / (1.0 + at::exp(-logit(n + i, 1, hc_init_entry(n, k, i, 0)))));
      const at::Tensor term = pre.unsqueeze(-1) * st.at(key("H", i));
      h_in = h_in.defined() ? h_in + term : term;
    }
    Tensors rows;
    for (int64_t i = 0; i < n; ++i) {
      Tensors row;
      for (int64_t j = 0; j < n; ++j) row.push_back(logit(2 * n + i * n + j, 2, i == j ? 1.0 : 0.0));
      rows.push_back(at::stack(row, -1));
    }
    const at::Tensor res = sinkhorn_reference(at::stack(rows, -2), iters_);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) st.set(key("mix", i, j), res.select(-2, i).select(-1, j));
    return h_in;
  }

  int64_t iters_;
};

}  // namespace

std::shared_ptr<const ResidualStream> standard_stream() {
  static const std::shared_ptr<const ResidualStream> s = std::make_shared<StandardStream>();
  return s;
}
std::shared_ptr<const ResidualStream> hc_stream(int64_t n) { return std::make_shared<HcStream>(n); }
std::shared_ptr<const ResidualStream> mhc_stream(int64_t n, int64_t sinkhorn_iters) {
  return std::make_shared<MhcStream>(n, sinkhorn_iters);
}

at::Tensor sinkhorn(const at::Tensor& logits, int64_t iters) {
  if (iters < 1) throw InputError(fmt::format("Sinkhorn–Knopp needs at least one iteration ({})", iters));
  at::Tensor L = logits.to(coef_dtype(logits));
  for (int64_t it = 0; it < iters; ++it) {
    L = L - L.logsumexp(-2, /*keepdim=*/true);  // columns
    L = L - L.logsumexp(-1, /*keepdim=*/true);  // rows
  }
  return L.exp();
}

at::Tensor sinkhorn_reference(const at::Tensor& logits, int64_t iters) {
  if (iters < 1) throw InputError(fmt::format("Sinkhorn–Knopp needs at least one iteration ({})", iters));
  const int64_t n = logits.size(-1);
  std::vector<Tensors> L(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) L[size_t(i)].push_back(logits.select(-2, i).select(-1, j).to(at::kDouble));
  // L[i][j] −= log Σ_(entries of its column or row) exp(·), with the maximum taken out first
  auto normalise = [&](bool columns) {
    for (int64_t a = 0; a < n; ++a) {
      auto entry = [&](int64_t b) -> at::Tensor& { return columns ? L[size_t(b)][size_t(a)] : L[size_t(a)][size_t(b)]; };
      at::Tensor m = entry(0).detach();
      for (int64_t b = 1; b < n; ++b) m = at::maximum(m, entry(b).detach());
      at::Tensor sum = at::exp(entry(0) - m);
      for (int64_t b = 1; b < n; ++b) sum = sum + at::exp(entry(b) - m);
      const at::Tensor lse = m + at::log(sum);
      for (int64_t b = 0; b < n; ++b) entry(b) = entry(b) - lse;
    }
  };
  for (int64_t it = 0; it < iters; ++it) {
    normalise(/*columns=*/true);
    normalise(/*columns=*/false);
  }
  Tensors rows;
  for (int64_t i = 0; i < n; ++i) {
    Tensors row;
    for (int64_t j = 0; j < n; ++j) row.push_back(at::exp(L[size_t(i)][size_t(j)]));
    rows.push_back(at::stack(row, -1));
  }
  return at::stack(rows, -2);
}

namespace {

const char* kHcCitation = "Zhu et al., Hyper-Connections, arXiv 2409.19606, Eq. 10–14";
const char* kMhcCitation = "DeepSeek, mHC: Manifold-Constrained Hyper-Connections, arXiv 2512.24880, Eq. 7–9";

MIXBENCH_REGISTER(stream_method({"residual_standard",
                                 "single-stream pre-norm residual h + F(norm(h)) on dense_full (no resid/x0 lambdas, no backout)",
                                 "He et al. 2016 / Xiong et al. 2020 (pre-norm residual); seed 001",
                                 nullptr, [](const Config&) { return standard_stream(); }}));

MIXBENCH_REGISTER(stream_method({"hc", "dynamic Hyper-Connections, n streams (default 4), on dense_full", kHcCitation,
                                 [](ConfigSpec& s) { s.i("streams", 4, "hc: residual streams n", 1, 64); },
                                 [](const Config& c) { return hc_stream(c.i("streams")); }}));

MIXBENCH_REGISTER(stream_method(
    {"mhc", "mHC: n streams (default 4), sigmoid read/write maps, Sinkhorn–Knopp residual map, on dense_full",
     kMhcCitation,
     [](ConfigSpec& s) {
       s.i("streams", 4, "mhc: residual streams n", 1, 64)
           .i("sinkhorn_iters", 20, "mhc: Sinkhorn–Knopp iterations of the residual map (log domain)", 1, 1000);
     },
     [](const Config& c) { return mhc_stream(c.i("streams"), c.i("sinkhorn_iters")); }}));

}  // namespace
}  // namespace mixbench::residual
