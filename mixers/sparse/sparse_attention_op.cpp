// Op `sparse_attention`: causal token-sparse softmax attention over given key indices, as FLA's
// naive_dsa with `indices` supplied (fla/ops/dsa/naive.py). q [B,T,H,D], k [B,T,Hkv,D],
// v [B,T,Hkv,Dv], indices [B,T,topk] int64, −1 padded (anywhere in the row), shared by all query
// heads; every index must satisfy 0 ≤ s ≤ t and a row may not repeat a key (a selection is a
// set). Softmax over the selected keys only; a query whose row is all −1 gets o_t = 0 (FLA's
// naive would give NaN there). Indices carry no gradient.
//
// CUDA path: the token-sparse kernels (token_sparse_kernel.cu: one block per query and all its
// heads, online softmax, fp32 atomics for dk / dv) for fp32 / bf16 / fp16 and D = Dv ∈ {64, 128}
// after the op's checks; other shapes the LibTorch code below in fp32.
//
// CPU path: one gather of the selected K/V rows per (batch, query) — [B,T,K,Hkv,D] — then
// batched matmuls per KV-head group, a masked softmax over the K slots, and a weighted sum, so
// work is O(B·T·K·H·D) rather than O(T²).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <limits>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/common/qkv_op.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/token_sparse_cuda.h"
#include "reference/sparse.h"

namespace mixbench {

namespace {

using qkv_op::resolve_scale;

// Value checks on an index tensor [B,T,K]: −1 ≤ index < T, index ≤ t, no repeated key in a row.
void check_indices(const char* op, const at::Tensor& indices, int64_t T) {
  at::Tensor ic = indices.to(at::kCPU).contiguous();
  if (ic.numel() == 0) return;
  if ((ic < -1).any().item<bool>()) {
    throw InputError(fmt::format("{}: 'indices' holds {} (only −1 may pad an empty slot)", op,
                                 ic.min().item<int64_t>()));
  }
  if ((ic >= T).any().item<bool>()) {
    throw InputError(fmt::format("{}: 'indices' holds key {} but T = {} (index ≥ T)", op,
                                 ic.max().item<int64_t>(), T));
  }
  at::Tensor tpos = at::arange(T, ic.options()).view({1, T, 1});
  at::Tensor bad = ic > tpos;
  if (bad.any().item<bool>()) {
    at::Tensor where = bad.nonzero()[0];
    const int64_t b = where[0].item<int64_t>(), t = where[1].item<int64_t>(), j = where[2].item<int64_t>();
    throw InputError(fmt::format("{}: non-causal index: indices[{},{},{}] = {} > query position {}", op, b, t, j,
                                 ic[b][t][j].item<int64_t>(), t));
  }
  if (ic.size(2) > 1) {
    at::Tensor srt = std::get<0>(ic.sort(-1));
    at::Tensor dup = (srt.slice(2, 1) == srt.slice(2, 0, -1)).logical_and(srt.slice(2, 1) >= 0);
    if (dup.any().item<bool>()) {
      at::Tensor where = dup.nonzero()[0];
      throw InputError(fmt::format("{}: 'indices' row [{},{}] selects key {} twice", op, where[0].item<int64_t>(),
                                   where[1].item<int64_t>(), srt[where[0]][where[1]][where[2]].item<int64_t>()));
    }
  }
}

void check_sparse_inputs(const TensorMap& in, const Config& p) {
  qkv_op::check_inputs("sparse_attention", in, {"indices"});
  const auto &q = in.at("q"), &idx = in.at("indices");
  const int64_t B = q.size(0), T = q.size(1);
  if (idx.scalar_type() != at::kLong)
    throw InputError(fmt::format("sparse_attention: 'indices' must be int64, got {}", c10::toString(idx.scalar_type())));
  if (idx.dim() != 3 || idx.size(0) != B || idx.size(1) != T || idx.size(2) != p.i("topk"))
    throw InputError(fmt::format("sparse_attention: 'indices' must be [B,T,topk] = [{},{},{}], got {}", B, T,
                                 p.i("topk"), c10::str(idx.sizes())));
  check_indices("sparse_attention", idx, T);
}

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_sparse_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", reference::sparse_attention(q, in.at("k"), in.at("v"), in.at("indices"), resolve_scale(p, q.size(3)))}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_sparse_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", sparse_attention_cpu(q, in.at("k"), in.at("v"), in.at("indices"), resolve_scale(p, q.size(3)))}};
}

// The layers' entry point after the op's checks: the kernels where they apply, else fp32 LibTorch.
TensorMap cuda_fn(const TensorMap& in, const Config& p) {
  check_sparse_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", sparse_attention_fast(q, in.at("k"), in.at("v"), in.at("indices"), resolve_scale(p, q.size(3)))}};
}

// Random causal selections: each row picks min(topk, t+1) distinct keys ≤ t uniformly, and the
// selected keys and the −1 padding are shuffled across the row's slots.
at::Tensor random_indices(int64_t B, int64_t T, int64_t topk, at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  at::Tensor r = at::rand({B, T, T}, gen, o);
  at::Tensor future = at::arange(T).view({1, -1}) > at::arange(T).view({-1, 1});  // [T,T] s > t
  r = r.masked_fill(future.unsqueeze(0), 2.0);
  at::Tensor order = std::get<1>(r.sort(-1));  // visible keys first, in random order
  const int64_t S = std::min(topk, T);
  at::Tensor sel = order.slice(2, 0, S);
  at::Tensor vis = at::gather(r, 2, sel) < 2.0;
  sel = sel.masked_fill(vis.logical_not(), -1);
  if (topk > S) sel = at::cat({sel, at::full({B, T, topk - S}, -1, sel.options())}, 2);
  at::Tensor perm = std::get<1>(at::rand({B, T, topk}, gen, o).sort(-1));
  return at::gather(sel, 2, perm).contiguous();
}

TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  TensorMap m = qkv_op::make_inputs(c, B, T, gen);
  m.set("indices", random_indices(B, T, c.i("topk"), gen));
  return m;
}

ConfigSpec params_spec() {
  return qkv_op::params("sparse_attention",
                        [](ConfigSpec& s) { s.i("topk", 16, "index slots per query (last dim of indices)", 1); });
}

std::vector<CaseDef> cases() {
  ConfigSpec s = params_spec();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  return {
      {"T1", c("H=2,Hkv=2,D=8,topk=4"), 1, 1},
      {"odd_B2", c("H=4,Hkv=4,D=16,topk=8"), 2, 37},
      {"gqa", c("H=4,Hkv=2,D=16,topk=16"), 2, 45},
      {"mqa", c("H=4,Hkv=1,D=8,topk=5"), 1, 33},
      {"topk1", c("H=2,Hkv=1,D=8,topk=1"), 2, 9},
      {"topk_gt_T", c("H=2,Hkv=2,D=8,topk=64"), 1, 20},
      {"gqa_T150", c("H=4,Hkv=2,D=16,topk=32"), 2, 150},
      {"scale_Dv", c("H=2,Hkv=2,D=8,Dv=12,scale=0.3,topk=7"), 2, 19},
      // the head dims of the CUDA kernels (smaller ones take the LibTorch path there)
      {"d64_gqa", c("H=4,Hkv=2,D=64,topk=24"), 2, 41},
      {"d128_topk_gt_T", c("H=3,Hkv=3,D=128,topk=40"), 1, 33},
  };
}

// Every key ≤ t selected (topk = T) must give dense causal attention: this op's reference and
// optimized path against the `attention` op's reference (window 0, no logit scale).
std::vector<std::pair<std::string, double>> dense_equivalence(const TensorMap& in, const Config& p, Backend b,
                                                              at::ScalarType dt) {
  const at::Tensor& q = in.at("q");
  const int64_t B = q.size(0), T = q.size(1);
  TensorMap full{{"q", q}, {"k", in.at("k")}, {"v", in.at("v")}, {"indices", causal_full_indices(B, T, q)}};
  return dense_equivalence_of("sparse_attention", full, p.with("topk", T), resolve_scale(p, q.size(3)), b, dt);
}

OpSpec make_spec() {
  OpSpec s = qkv_op::spec("sparse_attention", "sparse",
                           "causal token-sparse attention over given key indices (−1 padded, shared by all heads), GQA",
                           "DeepSeek-V3.2 DSA (arXiv 2512.02556); FLA fla/ops/dsa/naive.py naive_dsa", params_spec(),
                           {{"indices", /*differentiable=*/false}}, check_sparse_inputs);
  s.make_inputs = make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
  s.cuda = cuda_fn;
  s.cases = cases;
  s.invariants = dense_equivalence;
  return s;
}

}  // namespace

std::vector<std::pair<std::string, double>> dense_equivalence_of(const std::string& op, const TensorMap& full,
                                                                 const Config& pf, double scale, Backend b,
                                                                 at::ScalarType dt) {
  const OpSpec& attn = Registry::get().op("attention");
  Config pa = attn.params.defaults().with("scale", scale);
  TensorMap to_dt;
  for (const auto& [n, t] : full) to_dt.set(n, at::isFloatingType(t.scalar_type()) ? t.to(dt) : t);
  auto rel = [](const at::Tensor& ref, const at::Tensor& x) {
    at::Tensor r = ref.to(at::kDouble), d = r - x.to(at::kDouble);
    return d.pow(2).mean().sqrt().item<double>() / (r.pow(2).mean().sqrt().item<double>() + 1e-8);
  };
  at::Tensor dense = attn.reference(full, pa).at("o");
  at::Tensor ref = Registry::get().op(op).reference(full, pf).at("o");
  at::Tensor opt = call_op(op, b == Backend::Reference ? Backend::CPU : b, to_dt, pf).at("o");
  return {{"dense_equivalence/reference", rel(dense, ref)}, {"dense_equivalence/optimized", rel(dense, opt)}};
}

at::Tensor causal_full_indices(int64_t B, int64_t T, const at::Tensor& like) {
  auto o = at::TensorOptions().dtype(at::kLong).device(like.device());
  at::Tensor s = at::arange(T, o).view({1, T});
  at::Tensor t = at::arange(T, o).view({T, 1});
  return s.expand({T, T}).masked_fill(s > t, -1).unsqueeze(0).expand({B, T, T}).contiguous();
}

at::Tensor sparse_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& indices, double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(2), Dv = v.size(3), K = indices.size(2), G = H / Hkv;
  at::Tensor idx = indices.to(q.device());
  at::Tensor valid = idx >= 0;                                            // [B,T,K]
  at::Tensor base = at::arange(B, idx.options()).view({B, 1, 1}) * T;
  at::Tensor flat = (idx.clamp_min(0) + base).reshape({-1});              // rows of [B·T, ...]
  at::Tensor kg = k.reshape({B * T, Hkv, D}).index_select(0, flat).view({B, T, K, Hkv, D});
  at::Tensor vg = v.reshape({B * T, Hkv, Dv}).index_select(0, flat).view({B, T, K, Hkv, Dv});
  at::Tensor qg = q.reshape({B, T, Hkv, G, D});
  // [B,T,Hkv,G,D] @ [B,T,Hkv,D,K] -> [B,T,Hkv,G,K]
  at::Tensor logits = at::matmul(qg, kg.permute({0, 1, 3, 4, 2})) * scale;
  at::Tensor vmask = valid.view({B, T, 1, 1, K});
  at::Tensor any = valid.any(-1).view({B, T, 1, 1, 1});
  // Empty rows get finite logits (uniform softmax, then zeroed) so that no NaN reaches autograd.
  logits = logits.masked_fill(vmask.logical_not().logical_and(any), -std::numeric_limits<double>::infinity());
  at::Tensor p = at::softmax(logits, -1).masked_fill(vmask.logical_not(), 0.0);
  // [B,T,Hkv,G,K] @ [B,T,Hkv,K,Dv] -> [B,T,Hkv,G,Dv]
  at::Tensor o = at::matmul(p, vg.permute({0, 1, 3, 2, 4}));
  return o.reshape({B, T, H, Dv});
}

MIXBENCH_REGISTER(make_spec());

at::Tensor up_to_fp32(const at::Tensor& x) {
  return x.defined() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) ? x.to(at::kFloat) : x;
}

at::Tensor sparse_attention_fast(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& indices, double scale) {
  if (sparse_attention_kernel_applies(q, k, v, indices)) return sparse_attention_kernel(q, k, v, indices, scale);
  return sparse_attention_cpu(up_to_fp32(q), up_to_fp32(k), up_to_fp32(v), indices, scale).to(q.scalar_type());
}

TensorMap run_in_fp32(const OpFn& fn, const TensorMap& in, const Config& p) {
  at::ScalarType half = at::kFloat;
  TensorMap up;
  for (const auto& [name, t] : in) {
    if (t.defined() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf)) {
      half = t.scalar_type();
      up.set(name, t.to(at::kFloat));
    } else {
      up.set(name, t);
    }
  }
  TensorMap out = fn(up, p);
  if (half == at::kFloat) return out;
  TensorMap down;
  for (const auto& [name, t] : out) down.set(name, t.defined() && t.scalar_type() == at::kFloat ? t.to(half) : t);
  return down;
}

}  // namespace mixbench
