// Op `simple_gla`: gated linear attention with one log decay per head and token,
//   S_t = exp(g_t) S_{t-1} + k_t v_tᵀ,   o_t = S_tᵀ (scale·q_t),
// the recurrence of flash-linear-attention's fla/ops/simple_gla (naive_recurrent_simple_gla).
// Used by retnet (fixed γ_h), lightning (fixed γ_h) and the ELU variants (g = 0).
//
// CPU path: simple_gla_chunked_cpu (gla_cpu.cpp), the same chunked algorithm on raw buffers; below,
// the LibTorch chunked algorithm (autograd, other devices), chunk C = 64 (the sequence is zero-padded to a multiple of 64
// with g = 0 and k = v = 0, which leaves the state unchanged). Within a chunk, b = cumsum(g):
//   o_intra = ((q kᵀ) ⊙ exp(b_i − b_j)[i ≥ j]) v          (the mask is applied before exp)
//   o_inter = (q ⊙ exp(b)) S_c
//   S_{c+1} = exp(b_L) S_c + (k ⊙ exp(b_L − b))ᵀ v
// All exponents are ≤ 0 because g ≤ 0 (log decays); autograd differentiates through it.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mixers/common/layers.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "mixers/linear/gated_op_spec.h"
#include "mixers/linear/chunk_cuda.h"
#include "mixers/linear/gla_ops.h"
#include "mixers/linear/recompute.h"
#include "reference/gla.h"

namespace mixbench {
namespace linear {

int64_t gla_padded_len(int64_t T) { return ((T + kGlaChunk - 1) / kGlaChunk) * kGlaChunk; }

double simple_gla_chunk_flops(int64_t K, int64_t V) {
  const double C = double(kGlaChunk);
  return 2 * C * C * double(K) + 2 * C * C * double(V) + 4 * C * double(K) * double(V);
}

namespace {
// [B,T,H,D] -> zero-padded, contiguous [B,H,N,C,D]
at::Tensor to_chunks(const at::Tensor& x, int64_t N) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  at::Tensor p = N * kGlaChunk > T ? at::constant_pad_nd(x, {0, 0, 0, 0, 0, N * kGlaChunk - T}) : x;
  return p.reshape({B, N, kGlaChunk, H, D}).permute({0, 3, 1, 2, 4}).contiguous();
}

// One block of at most kGlaBlockChunks chunks (tokens [B,L,H,·]) entering with state S:
// returns (o [B,L,H,V], the state after the block).
std::pair<at::Tensor, at::Tensor> simple_gla_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& g, double scale, at::Tensor S,
                                                   const at::Tensor& upper) {
  const int64_t B = q.size(0), L = q.size(1), H = q.size(2), V = v.size(3);
  const int64_t N = (L + kGlaChunk - 1) / kGlaChunk, C = kGlaChunk;
  at::Tensor qc = to_chunks(q, N), kc = to_chunks(k, N), vc = to_chunks(v, N);
  at::Tensor gp = N * C > L ? at::constant_pad_nd(g, {0, 0, 0, N * C - L}) : g;
  at::Tensor b = gp.reshape({B, N, C, H}).permute({0, 3, 1, 2}).cumsum(-1);  // [B,H,N,C]

  // intra-chunk: decay exp(b_i − b_j) for i ≥ j, masked to −inf above the diagonal before exp
  at::Tensor decay = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(upper, -INFINITY).exp();
  at::Tensor A = at::matmul(qc, kc.transpose(-1, -2)) * decay;  // [B,H,N,C,C]
  at::Tensor o = at::matmul(A, vc);                              // [B,H,N,C,V]

  // chunk-level state recursion
  at::Tensor bL = b.select(-1, C - 1);                                                      // [B,H,N]
  at::Tensor U = at::matmul((kc * (bL.unsqueeze(-1) - b).exp().unsqueeze(-1)).transpose(-1, -2), vc);  // [B,H,N,K,V]
  at::Tensor dL = bL.exp().unsqueeze(-1).unsqueeze(-1);                                     // [B,H,N,1,1]
  std::vector<at::Tensor> starts;
  starts.reserve(size_t(N));
  // unbind (not select in the loop): its backward is one stack, so the loop stays O(N)
  std::vector<at::Tensor> Us = U.unbind(2), dLs = dL.unbind(2);
  for (int64_t n = 0; n < N; ++n) {
    starts.push_back(S);
    S = at::addcmul(Us[size_t(n)], S, dLs[size_t(n)]);
  }
  o = o + at::matmul(qc * b.exp().unsqueeze(-1), at::stack(starts, 2));
  // the scale on q, applied once to the output (linear in q) while it is put in [B,T,H,V] order
  o = (o.permute({0, 2, 3, 1, 4}) * scale).reshape({B, N * C, H, V});
  if (N * C > L) o = o.slice(1, 0, L);
  return {o, S};
}
}  // namespace

// The sequence is processed in blocks of kGlaBlockChunks chunks with the state carried from block
// to block: every intermediate ([B,H,n,C,C] decays and scores, [B,H,n,K,V] chunk states) is bounded
// by the block, not by T, so it stays cache-resident and the cost per token does not grow with T.
// Within a block everything but the chunk state recursion is batched over its chunks.
std::pair<at::Tensor, at::Tensor> simple_gla_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& g, double scale, const at::Tensor& h0) {
  if (layers::is_half(q)) {
    auto [o, ht] = simple_gla_chunked(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(g), scale, layers::f32(h0));
    return {o.to(q.scalar_type()), ht};
  }
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const int64_t C = kGlaChunk, blk = C * kGlaBlockChunks;
  at::Tensor upper = at::ones({C, C}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
  at::Tensor S = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options());
  if (T <= blk) {
    auto [o, St] = simple_gla_block(q, k, v, g, scale, S, upper);
    return {o.contiguous(), St};
  }
  std::vector<at::Tensor> outs;
  outs.reserve(size_t((T + blk - 1) / blk));
  for (int64_t t0 = 0; t0 < T; t0 += blk) {
    const int64_t L = std::min(blk, T - t0);
    auto [o, St] = simple_gla_block(q.narrow(1, t0, L), k.narrow(1, t0, L), v.narrow(1, t0, L), g.narrow(1, t0, L),
                                    scale, S, upper);
    outs.push_back(o);
    S = St;
  }
  return {at::cat(outs, 1), S};
}

std::pair<at::Tensor, at::Tensor> simple_gla_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& g, double scale, const at::Tensor& state) {
  if (layers::is_half(q)) {
    auto [o, s] = simple_gla_step(layers::f32(q), layers::f32(k), layers::f32(v), layers::f32(g), scale, layers::f32(state));
    return {o.to(q.scalar_type()), s};
  }
  at::Tensor S = state * g.exp().unsqueeze(-1).unsqueeze(-1) + k.unsqueeze(-1) * v.unsqueeze(-2);
  at::Tensor o = at::matmul((q * scale).unsqueeze(-2), S).squeeze(-2);  // [B,H,V]
  return {o, S};
}

bool simple_gla_cuda_eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                              const at::Tensor& h0) {
#if defined(MIXBENCH_WITH_CUDA)
  if (!q.defined() || !k.defined() || !v.defined() || !g.defined()) return false;
  if (!q.is_cuda() || k.device() != q.device() || v.device() != q.device() || g.device() != q.device()) return false;
  if (h0.defined() && h0.device() != q.device()) return false;
  const auto dt = q.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return false;
  if (k.scalar_type() != dt || v.scalar_type() != dt || !at::isFloatingType(g.scalar_type())) return false;
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.dim() != 4 || g.dim() != 3) return false;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  if (v.size(0) != B || v.size(1) != T || v.size(2) != H || g.sizes() != at::IntArrayRef{B, T, H}) return false;
  if (h0.defined() && h0.sizes() != at::IntArrayRef{B, H, K, V}) return false;
  return (K == 64 || K == 128) && (V == 64 || V == 128);
#else
  return false;
#endif
}

#if defined(MIXBENCH_WITH_CUDA)
namespace {
// Autograd for the CUDA forward: the forward runs the kernel; the backward recomputes the
// forward through the LibTorch chunked path (simple_gla_chunked, same algorithm, same result up to
// rounding) under grad mode on the saved inputs and backpropagates through it. So the CUDA path is
// differentiable and its gradients are exactly the LibTorch path's; there is no CUDA backward kernel.
struct SimpleGlaCudaFn : public torch::autograd::Function<SimpleGlaCudaFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& h0_arg, double scale) {
    // An absent h0 arrives as an empty tensor (Function::apply needs defined tensor arguments).
    const at::Tensor h0 = h0_arg.numel() > 0 ? h0_arg : at::Tensor();
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({q, k, v, g, h0.defined() ? h0 : at::Tensor()});
    auto [o, ht] = simple_gla_fwd_cuda(q, k, v, g, scale, h0);
    return {o, ht};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    return recompute_backward(ctx, grads, 6, [scale](const std::vector<at::Tensor>& in) {
      return simple_gla_chunked(in[0], in[1], in[2], in[3], scale, in[4]);
    });
  }
};
}  // namespace

std::pair<at::Tensor, at::Tensor> simple_gla_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& g, double scale, const at::Tensor& h0) {
  auto r = SimpleGlaCudaFn::apply(q, k, v, g, h0.defined() ? h0 : at::empty({0}, q.options().dtype(at::kFloat)), scale);
  return {r[0], r[1]};
}
#endif

std::vector<std::pair<std::string, double>> gla_family_invariants(const TensorMap& inputs, double scale,
                                                                  GlaChunkFn chunked, GlaStepFn step,
                                                                  at::ScalarType dtype, bool cuda) {
  c10::NoGradGuard ng;
  auto dev = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  auto cast = [&](const std::string& n) { return inputs.at(n).detach().to(dev, dtype); };
  at::Tensor q = cast("q"), k = cast("k"), v = cast("v"), g = cast("g");
  at::Tensor h0 = inputs.has("h0") ? cast("h0") : at::Tensor();
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  auto err = [](const at::Tensor& ref, const at::Tensor& x) { return compare(ref, x).rel_rms; };
  auto [o, ht] = chunked(q, k, v, g, scale, h0);
  std::vector<std::pair<std::string, double>> out;

  // recurrent, token by token
  at::Tensor S = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options());
  std::vector<at::Tensor> os;
  for (int64_t t = 0; t < T; ++t) {
    auto [ot, St] = step(q.select(1, t), k.select(1, t), v.select(1, t), g.select(1, t), scale, S);
    os.push_back(ot);
    S = St;
  }
  out.emplace_back("chunked_vs_recurrent", std::max(err(at::stack(os, 1), o), err(S, ht)));

  // prefill(T − n) then n decode steps
  const int64_t n = std::min<int64_t>(5, T);
  const int64_t Tp = T - n;
  at::Tensor S2 = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options());
  if (Tp > 0) S2 = chunked(q.slice(1, 0, Tp), k.slice(1, 0, Tp), v.slice(1, 0, Tp), g.slice(1, 0, Tp), scale, h0).second;
  std::vector<at::Tensor> od;
  for (int64_t t = Tp; t < T; ++t) {
    auto [ot, St] = step(q.select(1, t), k.select(1, t), v.select(1, t), g.select(1, t), scale, S2);
    od.push_back(ot);
    S2 = St;
  }
  out.emplace_back("prefill_decode", std::max(err(o.slice(1, Tp), at::stack(od, 1)), err(ht, S2)));

  // split in two with the state carried
  if (T >= 2) {
    const int64_t T1 = T / 2 + 3 < T ? T / 2 + 3 : T / 2;  // not on a chunk boundary in general
    auto [o1, h1] = chunked(q.slice(1, 0, T1), k.slice(1, 0, T1), v.slice(1, 0, T1), g.slice(1, 0, T1), scale, h0);
    auto [o2, h2] = chunked(q.slice(1, T1), k.slice(1, T1), v.slice(1, T1), g.slice(1, T1), scale, h1);
    out.emplace_back("split_state", std::max(err(o, at::cat({o1, o2}, 1)), err(ht, h2)));
  }
  return out;
}

}  // namespace linear

namespace {

double resolve_scale(const Config& p, int64_t K) {
  double s = p.f("scale");
  return s > 0 ? s : 1.0 / std::sqrt(double(K));
}

void check_inputs(const TensorMap& in, const Config& p) {
  for (const char* n : {"q", "k", "v", "g"})
    if (!in.has(n)) throw InputError(fmt::format("simple_gla: missing input '{}'", n));
  const auto &q = in.at("q"), &k = in.at("k"), &v = in.at("v"), &g = in.at("g");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) throw InputError("simple_gla: q, k, v must be [B,T,H,D]");
  if (k.sizes() != q.sizes()) throw InputError("simple_gla: q and k must have the same shape [B,T,H,K]");
  if (v.size(0) != q.size(0) || v.size(1) != q.size(1) || v.size(2) != q.size(2))
    throw InputError("simple_gla: v must be [B,T,H,V] with q's B, T, H");
  if (g.dim() != 3 || g.size(0) != q.size(0) || g.size(1) != q.size(1) || g.size(2) != q.size(2))
    throw InputError("simple_gla: g must be [B,T,H]");
  if (in.has("h0")) {
    const auto& h = in.at("h0");
    if (h.dim() != 4 || h.size(0) != q.size(0) || h.size(1) != q.size(2) || h.size(2) != q.size(3) ||
        h.size(3) != v.size(3))
      throw InputError("simple_gla: h0 must be [B,H,K,V]");
  }
}

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_inputs(in, p);
  auto [o, ht] = reference::simple_gla(in.at("q"), in.at("k"), in.at("v"), in.at("g"),
                                       resolve_scale(p, in.at("q").size(3)), in.get_or("h0", at::Tensor()));
  return {{"o", o}, {"ht", ht}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_inputs(in, p);
  auto [o, ht] = linear::simple_gla_chunked_cpu(in.at("q"), in.at("k"), in.at("v"), in.at("g"),
                                                resolve_scale(p, in.at("q").size(3)), in.get_or("h0", at::Tensor()));
  return {{"o", o}, {"ht", ht}};
}

// CUDA path: bf16 / fp16 inputs with K and V in {64, 128} run the tensor-core chunk kernels
// (chunk_cuda.h, forward and backward); fp32 inputs the fused fp32 forward kernel
// (simple_gla_cuda_eligible), else the chunked LibTorch path on whatever device the
// inputs are on. note_kernel records which one ran.
TensorMap cuda_fn(const TensorMap& in, const Config& p) {
  check_inputs(in, p);
  const at::Tensor h0 = in.get_or("h0", at::Tensor());
  const double scale = resolve_scale(p, in.at("q").size(3));
  if (linear::chunk_tc_eligible(in.at("q"), in.at("k"), in.at("v"), in.at("g"), at::Tensor(), h0)) {
    note_kernel("simple_gla_tc");
    auto [o, ht] = linear::simple_gla_tc(in.at("q"), in.at("k"), in.at("v"), in.at("g"), scale, h0);
    return {{"o", o}, {"ht", ht}};
  }
#if defined(MIXBENCH_WITH_CUDA)
  if (linear::simple_gla_cuda_eligible(in.at("q"), in.at("k"), in.at("v"), in.at("g"), h0)) {
    note_kernel("simple_gla_fwd_cuda");
    auto [o, ht] = linear::simple_gla_cuda(in.at("q"), in.at("k"), in.at("v"), in.at("g"), scale, h0);
    return {{"o", o}, {"ht", ht}};
  }
#endif
  note_kernel("chunked-libtorch");
  auto [o, ht] = linear::simple_gla_chunked(in.at("q"), in.at("k"), in.at("v"), in.at("g"), scale, h0);
  return {{"o", o}, {"ht", ht}};
}

TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  return linear::gated_op_inputs(c, B, T, gen, /*per_key=*/false);
}

std::vector<CaseDef> cases() {
  std::vector<CaseDef> out = linear::gated_op_cases();
  ConfigSpec s = linear::gated_op_params();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  // head sizes the CUDA kernel takes (K, V in {64, 128}): tail chunks, no h0, one exact chunk
  out.push_back({"T130_K64V128_B2_div4", c("H=2,K=64,V=128,gate_div=4"), 2, 130});
  out.push_back({"T77_K128V64_noh0_div16", c("H=1,K=128,V=64,gate_div=16"), 1, 77, 0, {"h0"}});
  out.push_back({"T64_K128V128_div1", c("H=1,K=128,V=128,gate_div=1"), 1, 64});
  out.push_back({"T3_K64V64_div1", c("H=2,K=64,V=64,gate_div=1"), 1, 3});
  return out;
}

OpSpec make_spec() {
  OpSpec s;
  s.name = "simple_gla";
  s.family = "linear";
  s.summary = "gated linear attention with a scalar log decay per head: S = exp(g) S + k vᵀ, o = Sᵀ(scale·q)";
  s.citation = "fla-org/flash-linear-attention fla/ops/simple_gla; RetNet (Sun et al. 2023)";
  s.params = linear::gated_op_params();
  s.inputs = {{"q"}, {"k"}, {"v"}, {"g"}, {"h0", true, true}};
  s.outputs = {"o", "ht"};
  s.make_inputs = make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
  // The fused CUDA forward kernel (simple_gla_cuda.cu) where eligible, else the device-agnostic
  // chunked LibTorch path (cuBLAS batched matmuls on the GPU).
  s.cuda = cuda_fn;
  s.cases = cases;
  s.check_inputs = check_inputs;
  s.invariants = [](const TensorMap& in, const Config& p, Backend b, at::ScalarType dt) {
    check_inputs(in, p);
    return linear::gla_family_invariants(in, resolve_scale(p, in.at("q").size(3)),
                                         b == Backend::CUDA ? linear::simple_gla_chunked : linear::simple_gla_chunked_cpu,
                                         linear::simple_gla_step, dt, b == Backend::CUDA);
  };
  return s;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
