// Op `dsa_indexer`: DeepSeek-V3.2's lightning indexer (FLA fla/ops/dsa/naive.py, naive_dsa_indexer):
//   I[t,s] = Σ_j w_idx[t,j] · act(scale · q_idx[t,j] · k_idx[s]),  s ≤ t,
// q_idx [B,T,H_I,D_I], k_idx [B,T,D_I] (one key shared by all indexer heads), w_idx [B,T,H_I]
// (optional: FLA sums the heads with weight 1 when it is absent). scale 0 = D_I^-0.5 (FLA's
// default); act = ReLU (as naive_dsa calls it) or none. Output `indices` [B,T,topk] int64: the
// min(topk, t+1) highest-scoring causal keys, in descending score order, the remaining slots −1.
// FLA returns only the indices (no scores), and so does this op.
//
// Ties: equal scores are resolved deterministically, the lowest key index first (torch.topk leaves
// the order among ties unspecified). Both paths implement this with a stable descending sort.
// Selections are compared as sets per query (OpSpec::selection_outputs), never by slot order, and
// keys tied with the k-th score may be exchanged (OpSpec::selection_scores): another top-k (FLA's
// torch.topk) keeps other tied keys, which is as correct.
//
// CPU path: per block of 256 queries, one batched matmul of the block's index queries against the
// keys it can see, activation, weighted head sum, causal mask, stable descending sort of the
// visible keys, first topk columns.
//
// CUDA path (dsa_indexer_fast, also the layers' path on every device for inputs that are not fp64):
// the same blocked scores in fp32, the block sized so that its tensors stay within ~256 MB
// (dsa_indexer_block), and top-k selection by topk_lowest_index — at::topk on keys packing the
// score and the key index, which gives exactly the stable sort's first topk columns (ties to the
// lowest key) without sorting all of a query's keys. No host synchronisation.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "reference/sparse.h"

namespace mixbench {

namespace {

double resolve_scale(const Config& p, int64_t D) {
  double s = p.f("scale");
  return s > 0 ? s : 1.0 / std::sqrt(double(D));
}

void check_indexer_inputs(const TensorMap& in, const Config& p) {
  for (const char* n : {"q_idx", "k_idx"})
    if (!in.has(n)) throw InputError(fmt::format("dsa_indexer: missing input '{}'", n));
  const auto &q = in.at("q_idx"), &k = in.at("k_idx");
  if (q.dim() != 4) throw InputError(fmt::format("dsa_indexer: 'q_idx' must be [B,T,H_I,D_I], got {} dims", q.dim()));
  if (k.dim() != 3) throw InputError(fmt::format("dsa_indexer: 'k_idx' must be [B,T,D_I], got {} dims", k.dim()));
  if (k.size(0) != q.size(0) || k.size(1) != q.size(1))
    throw InputError("dsa_indexer: q_idx and k_idx must share batch and length");
  if (k.size(2) != q.size(3))
    throw InputError(fmt::format("dsa_indexer: q_idx head dim {} differs from k_idx dim {}", q.size(3), k.size(2)));
  if (in.has("w_idx")) {
    const auto& w = in.at("w_idx");
    if (w.dim() != 3 || w.size(0) != q.size(0) || w.size(1) != q.size(1) || w.size(2) != q.size(2))
      throw InputError(fmt::format("dsa_indexer: 'w_idx' must be [B,T,H_I] = [{},{},{}], got {}", q.size(0),
                                   q.size(1), q.size(2), c10::str(w.sizes())));
  }
  for (const auto& [n, t] : in)
    if (!at::isFloatingType(t.scalar_type()))
      throw InputError(fmt::format("dsa_indexer: '{}' must be a floating tensor", n));
}

bool use_relu(const Config& p) { return p.s("activation") == "relu"; }

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_indexer_inputs(in, p);
  const auto& q = in.at("q_idx");
  return {{"indices", reference::dsa_indexer(q, in.at("k_idx"), in.get_or("w_idx", at::Tensor()), p.i("topk"),
                                             resolve_scale(p, q.size(3)), use_relu(p))}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_indexer_inputs(in, p);
  const auto& q = in.at("q_idx");
  return {{"indices", dsa_indexer_cpu(q, in.at("k_idx"), in.get_or("w_idx", at::Tensor()), p.i("topk"),
                                      resolve_scale(p, q.size(3)), use_relu(p))}};
}

// After the op's checks, the layers' path: blocked fp32 scores, top-k by topk_lowest_index.
TensorMap cuda_fn(const TensorMap& in, const Config& p) {
  check_indexer_inputs(in, p);
  const auto& q = in.at("q_idx");
  return {{"indices", dsa_indexer_fast(q, in.at("k_idx"), in.get_or("w_idx", at::Tensor()), p.i("topk"),
                                       resolve_scale(p, q.size(3)), use_relu(p))}};
}

// The reference's FP64 scores I[b,t,s] of every key, −inf for the future keys s > t: the candidates'
// scores of `indices` (OpSpec::selection_scores), so that a selection keeping other keys tied with the
// k-th score (torch.topk's choice among ReLU's zeros, for one) is recognised as equally correct.
TensorMap scores_fn(const TensorMap& in, const Config& p) {
  check_indexer_inputs(in, p);
  c10::NoGradGuard ng;
  const at::Tensor q = in.at("q_idx").detach().to(at::kCPU, at::kDouble);
  const at::Tensor k = in.at("k_idx").detach().to(at::kCPU, at::kDouble);
  const int64_t T = q.size(1);
  at::Tensor sim = at::einsum("bthd,bsd->btsh", {q, k}) * resolve_scale(p, q.size(3));  // [B,T,T,HI]
  if (use_relu(p)) sim = sim.clamp_min(0.0);
  at::Tensor score = in.has("w_idx") ? (sim * in.at("w_idx").detach().to(at::kCPU, at::kDouble).unsqueeze(2)).sum(-1)
                                     : sim.sum(-1);
  at::Tensor future = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
  return {{"indices", score.masked_fill(future, -std::numeric_limits<double>::infinity())}};
}

// Gaussian inputs; with ties=1, small integers from {−2,−1,1,2} instead, so that many scores tie
// exactly (in every dtype) and the lowest-index rule is exercised.
TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t HI = c.i("HI"), DI = c.i("DI");
  auto draw = [&](std::vector<int64_t> shape) {
    if (!c.b("ties")) return at::randn(shape, gen, o);
    at::Tensor r = at::randint(0, 4, shape, gen, o);  // 0..3 -> -2,-1,1,2
    return r - 2.0 + (r >= 2).to(at::kDouble);
  };
  return {{"q_idx", draw({B, T, HI, DI})}, {"k_idx", draw({B, T, DI})}, {"w_idx", draw({B, T, HI})}};
}

ConfigSpec params_spec() {
  ConfigSpec s;
  s.i("topk", 16, "keys selected per query", 1)
      .f("scale", 0.0, "scale inside the activation; 0 = D_I^-0.5 (FLA's default)", 0.0)
      .s("activation", "relu", "activation of the head-wise similarities", {"relu", "none"})
      .i("HI", 4, "indexer heads (case shape)", 1)
      .i("DI", 16, "indexer head dim (case shape)", 1)
      .b("ties", false, "case inputs: small integers with many exactly tied scores");
  return s;
}

std::vector<CaseDef> cases() {
  ConfigSpec s = params_spec();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  return {
      {"T1", c("HI=2,DI=8,topk=4"), 1, 1},
      {"odd_B2", c("HI=4,DI=16,topk=8"), 2, 37},
      {"topk_gt_T", c("HI=4,DI=8,topk=64"), 1, 20},
      {"topk1", c("HI=2,DI=8,topk=1"), 2, 9},
      {"long_T300", c("HI=8,DI=16,topk=32"), 2, 300},
      {"no_activation", c("HI=4,DI=16,topk=10,activation=none"), 1, 41},
      {"no_weights", c("HI=4,DI=16,topk=12"), 2, 29, 0, {"w_idx"}},
      {"ties", c("HI=2,DI=4,topk=6,ties=true"), 2, 33},
      {"ties_scale", c("HI=3,DI=5,topk=9,ties=true,scale=2"), 1, 47},
  };
}

OpSpec make_spec() {
  OpSpec s;
  s.name = "dsa_indexer";
  s.family = "sparse";
  s.summary = "DSA lightning indexer: Σ_j w·ReLU(q_idx·k_idx) scores, causal top-k key indices (−1 padded)";
  s.citation = "DeepSeek-V3.2 (arXiv 2512.02556); FLA fla/ops/dsa/naive.py naive_dsa_indexer";
  s.params = params_spec();
  s.inputs = {{"q_idx", false}, {"k_idx", false}, {"w_idx", false, /*optional=*/true}};
  s.outputs = {"indices"};
  s.selection_outputs = {"indices"};
  s.selection_scores = scores_fn;
  s.make_inputs = make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
  s.cuda = cuda_fn;
  s.cases = cases;
  s.check_inputs = check_indexer_inputs;
  return s;
}

}  // namespace

at::Tensor dsa_indexer_cpu(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx,
                           int64_t topk, double scale, bool relu) {
  c10::NoGradGuard ng;
  const int64_t B = q_idx.size(0), T = q_idx.size(1), HI = q_idx.size(2), DI = q_idx.size(3);
  auto lopt = at::TensorOptions().dtype(at::kLong).device(q_idx.device());
  at::Tensor out = at::full({B, T, topk}, -1, lopt);
  constexpr int64_t kBlock = 256;
  for (int64_t q0 = 0; q0 < T; q0 += kBlock) {
    const int64_t q1 = std::min(T, q0 + kBlock), n = q1 - q0;
    // [B, n·HI, DI] @ [B, DI, q1] -> [B, n, HI, q1]: the block's queries against keys 0..q1-1
    at::Tensor qb = q_idx.slice(1, q0, q1).reshape({B, n * HI, DI});
    at::Tensor sim = at::bmm(qb, k_idx.slice(1, 0, q1).transpose(1, 2)).view({B, n, HI, q1}) * scale;
    if (relu) sim = at::relu(sim);
    at::Tensor score = w_idx.defined()
                           ? at::matmul(w_idx.slice(1, q0, q1).unsqueeze(-2), sim).squeeze(-2)  // [B,n,q1]
                           : sim.sum(2);
    at::Tensor s = at::arange(q1, lopt).view({1, q1});
    at::Tensor t = at::arange(q0, q1, lopt).view({n, 1});
    at::Tensor future = (s > t).unsqueeze(0);  // [1,n,q1]
    score = score.masked_fill(future, -std::numeric_limits<double>::infinity());
    // Stable descending sort: among equal scores the lower key index stays first.
    auto [vals, order] = at::sort(score, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
    const int64_t S = std::min(topk, q1);
    at::Tensor sel = order.slice(2, 0, S);
    // Slots past the t+1 visible keys hold future keys: pad them (a visible score is never -inf).
    sel = sel.masked_fill(sel > t.unsqueeze(0), -1);
    out.slice(1, q0, q1).slice(2, 0, S).copy_(sel);
  }
  return out;
}

int64_t dsa_indexer_block(int64_t B, int64_t T, int64_t HI, int64_t budget_bytes) {
  const int64_t per_query = std::max<int64_t>(1, B * T * (4 * HI + 40));
  return std::clamp<int64_t>(budget_bytes / per_query, 1, std::clamp<int64_t>(T, 1, kDsaIndexerQueryBlock));
}

at::Tensor dsa_indexer_topk(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx, int64_t topk,
                            double scale, bool relu, int64_t budget_bytes) {
  c10::NoGradGuard ng;
  const int64_t B = q_idx.size(0), T = q_idx.size(1), HI = q_idx.size(2), DI = q_idx.size(3);
  auto lopt = at::TensorOptions().dtype(at::kLong).device(q_idx.device());
  at::Tensor out = at::full({B, T, topk}, -1, lopt);
  const at::Tensor q = q_idx.detach().contiguous(), k = k_idx.detach().contiguous();
  const at::Tensor w = w_idx.defined() ? w_idx.detach().contiguous() : w_idx;
  const int64_t block = dsa_indexer_block(B, T, HI, budget_bytes);
  for (int64_t q0 = 0; q0 < T; q0 += block) {
    const int64_t q1 = std::min(T, q0 + block), n = q1 - q0;
    // [B, n·HI, DI] @ [B, DI, q1] -> [B, n, HI, q1]: the block's queries against keys 0..q1-1
    at::Tensor sim = at::bmm(q.slice(1, q0, q1).reshape({B, n * HI, DI}), k.slice(1, 0, q1).transpose(1, 2));
    sim = sim.view({B, n, HI, q1}).mul_(scale);
    if (relu) sim.relu_();
    at::Tensor score = w.defined() ? at::matmul(w.slice(1, q0, q1).unsqueeze(-2), sim).squeeze(-2)  // [B,n,q1]
                                   : sim.sum(2);
    sim.reset();
    at::Tensor s = at::arange(q1, lopt).view({1, q1});
    at::Tensor t = at::arange(q0, q1, lopt).view({n, 1});
    score.masked_fill_((s > t).unsqueeze(0), -std::numeric_limits<double>::infinity());
    const int64_t S = std::min(topk, q1);
    // Slots past the t+1 visible keys hold future keys: pad them (a visible score is never −inf).
    at::Tensor sel = topk_lowest_index(score, S);
    out.slice(1, q0, q1).slice(2, 0, S).copy_(sel.masked_fill_(sel > t.unsqueeze(0), -1));
  }
  return out;
}

at::Tensor dsa_indexer_fast(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx, int64_t topk,
                            double scale, bool relu) {
  const at::Tensor q = up_to_fp32(q_idx), k = up_to_fp32(k_idx), w = up_to_fp32(w_idx);
  const bool fp32 = q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                    (!w.defined() || w.scalar_type() == at::kFloat);
  if (!fp32) return dsa_indexer_cpu(q, k, w, topk, scale, relu);  // fp64: the stable sort of FP64 scores
  return dsa_indexer_topk(q, k, w, topk, scale, relu);
}

MIXBENCH_REGISTER(make_spec());

}  // namespace mixbench
