// Op `gla`: gated linear attention with a log decay per key channel (Yang et al. 2024),
//   S_t = diag(exp g_t) S_{t-1} + k_t v_tᵀ,   o_t = S_tᵀ (scale·q_t),   g [B,T,H,K] ≤ 0,
// the recurrence of flash-linear-attention's fla/ops/gla (naive_recurrent_gla).
//
// Chunked path (gla_chunked): chunk C = 64 (zero padding with g = 0), b = cumsum(g) per channel. The
// intra-chunk scores A_ij = Σ_k q_ik k_jk exp(b_ik − b_jk) (i ≥ j) cannot be written as one
// matmul without exponentials of positive numbers: key_gate_pair_scores (delta_chunk.h) forms the
// exponent explicitly only inside sub-blocks of 8 rows and takes the rest as products of q and k
// rescaled to each sub-block's first row (both exponents ≤ 0), as kda's chunked path does.
// Then o = A v + (q ⊙ exp b) S_c and S_{c+1} = diag(exp b_L) S_c + (k ⊙ exp(b_L − b))ᵀ v.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "mixers/common/layers.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/linear/gated_op_spec.h"
#include "mixers/linear/delta_chunk.h"
#include "mixers/linear/gla_ops.h"
#include "reference/gla.h"

namespace mixbench {
namespace linear {

// The CPU path (gla_chunked_cpu) folds the per-key decays into the operands of one C×C score
// product per chunk, so its products are simple_gla's. (gla_chunked below, the path of other
// devices and of the backward, spends about 2·C·8·K more per chunk on its sub-blocks.)
double gla_chunk_flops(int64_t K, int64_t V) { return simple_gla_chunk_flops(K, V); }

namespace {
at::Tensor to_chunks(const at::Tensor& x, int64_t N) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  at::Tensor p = N * kGlaChunk > T ? at::constant_pad_nd(x, {0, 0, 0, 0, 0, N * kGlaChunk - T}) : x;
  return p.reshape({B, N, kGlaChunk, H, D}).permute({0, 3, 1, 2, 4});  // [B,H,N,C,D]
}
}  // namespace

std::pair<at::Tensor, at::Tensor> gla_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& g, double scale, const at::Tensor& h0) {
  if (layers::is_half(q)) {
    auto [o, ht] = gla_chunked(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(g), scale, layers::f32(h0));
    return {o.to(q.scalar_type()), ht};
  }
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const int64_t C = kGlaChunk;
  const int64_t N = (T + C - 1) / C;
  at::Tensor qc = to_chunks(q * scale, N), kc = to_chunks(k, N), vc = to_chunks(v, N);
  at::Tensor b = to_chunks(g, N).cumsum(-2);  // [B,H,N,C,K]

  // A_ij = Σ_k q_ik k_jk exp(b_ik − b_jk) for j ≤ i (delta_chunk.h: per-key decays inside sub-blocks,
  // the rest as products of rescaled rows and columns, no exponential above 1)
  const at::Tensor A = key_gate_pair_scores(qc, kc, b);
  at::Tensor o = at::matmul(A, vc);  // [B,H,N,C,V]

  at::Tensor bL = b.select(3, C - 1);                                                                  // [B,H,N,K]
  at::Tensor U = at::matmul((kc * (bL.unsqueeze(3) - b).exp()).transpose(-1, -2), vc);               // [B,H,N,K,V]
  at::Tensor dL = bL.exp();
  at::Tensor St = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options());
  std::vector<at::Tensor> starts;
  starts.reserve(size_t(N));
  std::vector<at::Tensor> Us = U.unbind(2), dLs = dL.unbind(2);  // O(N) backward (see simple_gla)
  for (int64_t n = 0; n < N; ++n) {
    starts.push_back(St);
    St = St * dLs[size_t(n)].unsqueeze(-1) + Us[size_t(n)];
  }
  o = o + at::matmul(qc * b.exp(), at::stack(starts, 2));
  o = o.permute({0, 2, 3, 1, 4}).reshape({B, N * C, H, V});
  if (N * C > T) o = o.slice(1, 0, T);
  return {o.contiguous(), St};
}

std::pair<at::Tensor, at::Tensor> gla_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& g, double scale, const at::Tensor& state) {
  if (layers::is_half(q)) {
    auto [o, s] = gla_step(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(g), scale, layers::f32(state));
    return {o.to(q.scalar_type()), s};
  }
  at::Tensor S = state * g.exp().unsqueeze(-1) + k.unsqueeze(-1) * v.unsqueeze(-2);
  at::Tensor o = at::matmul((q * scale).unsqueeze(-2), S).squeeze(-2);
  return {o, S};
}


ConfigSpec gated_op_params() {
  ConfigSpec s;
  s.f("scale", 0.0, "query scale; 0 = K^-0.5", 0.0)
      .i("H", 2, "heads (case shape)", 1)
      .i("K", 16, "key head dim (case shape)", 1)
      .i("V", 16, "value head dim (case shape)", 1)
      .f("gate_div", 1.0, "case inputs: g = logsigmoid(randn)/gate_div", 1e-6);
  return s;
}

TensorMap gated_op_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen, bool per_key) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t H = c.i("H"), K = c.i("K"), V = c.i("V");
  at::Tensor q = at::randn({B, T, H, K}, gen, o), k = at::randn({B, T, H, K}, gen, o), v = at::randn({B, T, H, V}, gen, o);
  at::Tensor g = per_key ? at::randn({B, T, H, K}, gen, o) : at::randn({B, T, H}, gen, o);
  return {{"q", q}, {"k", k}, {"v", v}, {"g", at::log_sigmoid(g) / c.f("gate_div")}, {"h0", at::randn({B, H, K, V}, gen, o)}};
}

std::vector<CaseDef> gated_op_cases() {
  ConfigSpec s = gated_op_params();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  return {
      {"T1", c("H=2,K=8,V=8"), 1, 1},
      {"T1_noh0", c("H=2,K=8,V=8"), 1, 1, 0, {"h0"}},
      {"T37_B2_div1", c("H=2,K=16,V=16,gate_div=1"), 2, 37},
      {"T37_noh0_div4", c("H=2,K=16,V=16,gate_div=4"), 1, 37, 0, {"h0"}},
      {"T70_KneV_div16", c("H=2,K=16,V=24,gate_div=16"), 2, 70},
      {"T130_div1_noh0", c("H=3,K=8,V=12,gate_div=1"), 1, 130, 0, {"h0"}},
      {"T130_B2_div16_scale", c("H=2,K=12,V=8,gate_div=16,scale=0.5"), 2, 130},
      {"T64_div4", c("H=1,K=8,V=8,gate_div=4"), 1, 64},
  };
}

}  // namespace linear

namespace {

double resolve_scale(const Config& p, int64_t K) {
  double s = p.f("scale");
  return s > 0 ? s : 1.0 / std::sqrt(double(K));
}

void check_inputs(const TensorMap& in, const Config& p) {
  for (const char* n : {"q", "k", "v", "g"})
    if (!in.has(n)) throw InputError(fmt::format("gla: missing input '{}'", n));
  const auto &q = in.at("q"), &k = in.at("k"), &v = in.at("v"), &g = in.at("g");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) throw InputError("gla: q, k, v must be [B,T,H,D]");
  if (k.sizes() != q.sizes()) throw InputError("gla: q and k must have the same shape [B,T,H,K]");
  if (g.sizes() != q.sizes()) throw InputError("gla: g must be [B,T,H,K] like q");
  if (v.size(0) != q.size(0) || v.size(1) != q.size(1) || v.size(2) != q.size(2))
    throw InputError("gla: v must be [B,T,H,V] with q's B, T, H");
  if (in.has("h0")) {
    const auto& h = in.at("h0");
    if (h.dim() != 4 || h.size(0) != q.size(0) || h.size(1) != q.size(2) || h.size(2) != q.size(3) ||
        h.size(3) != v.size(3))
      throw InputError("gla: h0 must be [B,H,K,V]");
  }
}

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_inputs(in, p);
  auto [o, ht] = reference::gla(in.at("q"), in.at("k"), in.at("v"), in.at("g"), resolve_scale(p, in.at("q").size(3)),
                                in.get_or("h0", at::Tensor()));
  return {{"o", o}, {"ht", ht}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_inputs(in, p);
  auto [o, ht] = linear::gla_chunked_cpu(in.at("q"), in.at("k"), in.at("v"), in.at("g"),
                                         resolve_scale(p, in.at("q").size(3)), in.get_or("h0", at::Tensor()));
  return {{"o", o}, {"ht", ht}};
}

TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  return linear::gated_op_inputs(c, B, T, gen, /*per_key=*/true);
}


OpSpec make_spec() {
  OpSpec s;
  s.name = "gla";
  s.family = "linear";
  s.summary = "gated linear attention with a log decay per key channel: S = diag(exp g) S + k vᵀ";
  s.citation = "Yang et al. 2024 (GLA); fla-org/flash-linear-attention fla/ops/gla";
  s.params = linear::gated_op_params();
  s.inputs = {{"q"}, {"k"}, {"v"}, {"g"}, {"h0", true, true}};
  s.outputs = {"o", "ht"};
  s.make_inputs = make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
  // The chunked path is device-agnostic LibTorch: on the GPU it runs through cuBLAS batched matmuls.
  s.cuda = cpu_fn;
  s.cases = linear::gated_op_cases;
  s.check_inputs = check_inputs;
  s.invariants = [](const TensorMap& in, const Config& p, Backend b, at::ScalarType dt) {
    check_inputs(in, p);
    return linear::gla_family_invariants(in, resolve_scale(p, in.at("q").size(3)), linear::gla_chunked,
                                         linear::gla_step, dt, b == Backend::CUDA);
  };
  return s;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
