// The sparse layers' selections and their conformance below fp64 (harness/method_selection.h): the
// FP64 reference given a selection attends with it (and reproduces the forward given the same
// selection), a selection changed in one slot fails the selection check unless the slot's blocks
// tie, layer conformance reports that the reference took the optimized path's selection, the
// teachers computed in query chunks equal the unchunked ones, and the layers call no checked op
// (call_op) on their forward and backward path.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/method_selection.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "mixers/sparse/sparse_method.h"
#include "suites/conformance.h"
#include "suites/conformance_checks.h"
#include "suites/conformance_subject.h"

using namespace mixbench;
using Json = nlohmann::json;

namespace {

const std::vector<std::string> kSparse = {"dsa", "moba", "qsa", "nsa", "seer"};

double rel(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x - y).pow(2).mean().sqrt().item<double>() / (x.pow(2).mean().sqrt().item<double>() + 1e-300);
}

TensorMap layer_inputs(const MethodSpec& m, const CaseDef& c, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  TensorMap in = m.make_inputs(c.cfg, ctx, c.B, c.T, gen);
  for (const auto& d : m.params(c.cfg, ctx)) in.set(d.name, random_param(d, gen, at::TensorOptions().dtype(at::kDouble)));
  return in;
}

// The conformance cases of m with T ≤ max_T and at least one history block / key to choose from.
std::vector<CaseDef> short_cases(const MethodSpec& m, int64_t max_T) {
  std::vector<CaseDef> out;
  for (const CaseDef& c : m.cases())
    if (c.T > 1 && c.T <= max_T) out.push_back(c);
  return out;
}

// One slot of `sel` [..., k] changed: in the first row (scanning rows in order) that holds a
// history entry j (a non-forced slot ≥ 0) and a candidate it leaves out whose score differs from
// the entry's by more than `gap` (tied = false) or equals it (tied = true), the entry becomes that
// candidate. scores [..., n] as the layer's selection scores. Returns an undefined tensor when no
// row qualifies.
at::Tensor change_one_slot(const at::Tensor& sel, const at::Tensor& scores, bool tied, double gap) {
  const int64_t k = sel.size(-1), n = scores.size(-1);
  at::Tensor s = sel.reshape({-1, k}).clone();
  at::Tensor sc = scores.reshape({-1, n});
  auto sa = s.accessor<int64_t, 2>();
  auto ca = sc.accessor<double, 2>();
  for (int64_t r = 0; r < s.size(0); ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = sa[r][j];
      if (i < 0 || !std::isfinite(ca[r][i])) continue;  // empty, or the forced own block
      for (int64_t c = 0; c < n; ++c) {
        if (!std::isfinite(ca[r][c])) continue;
        bool taken = false;
        for (int64_t u = 0; u < k; ++u) taken = taken || sa[r][u] == c;
        if (taken) continue;
        const double d = std::abs(ca[r][c] - ca[r][i]);
        if (tied ? d == 0.0 : d > gap) {
          sa[r][j] = c;
          return s.view(sel.sizes());
        }
      }
    }
  return at::Tensor();
}

}  // namespace

// Every sparse method registers its selection and its CUDA path.
TEST(SparseSelection, MethodsRegisterSelectionAndCuda) {
  for (const auto& name : kSparse) {
    const MethodSpec& m = Registry::get().method(name);
    EXPECT_TRUE(m.has_cuda) << name;
    const MethodSelection* s = method_selection(name);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->outputs, std::set<std::string>{"selection"}) << name;
    EXPECT_TRUE(bool(s->scores)) << name;
  }
  EXPECT_EQ(method_selection("dense_full"), nullptr);
}

// FP64, CPU: the reference given the forward's selection reproduces the forward's outputs, returns
// that selection, and — given another (one slot changed) — attends with that one instead.
TEST(SparseSelection, ReferenceGivenTheSelectionReproducesTheForward) {
  c10::NoGradGuard ng;
  for (const auto& name : kSparse) {
    const MethodSpec& m = Registry::get().method(name);
    int changed_cases = 0;
    for (const CaseDef& c : short_cases(m, 45)) {
      LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
      TensorMap in = layer_inputs(m, c, 11);
      TensorMap fwd = m.forward(in, c.cfg, ctx, Backend::CPU);
      ASSERT_TRUE(fwd.has("selection")) << name;
      TensorMap forced = in;
      forced.set("selection", fwd.at("selection"));
      TensorMap ref = m.reference(forced, c.cfg, ctx);
      EXPECT_TRUE(at::equal(ref.at("selection"), fwd.at("selection"))) << name << " " << c.label;
      for (const auto& [n, t] : fwd) {
        if (n == "selection") continue;
        ASSERT_TRUE(ref.has(n)) << name << " " << n;
        EXPECT_LT(rel(t, ref.at(n)), 1e-10) << name << " " << c.label << " " << n;
      }
      // Another selection: the reference follows it (its y moves), and reports it.
      const at::Tensor scores = method_selection(name)->scores(in, c.cfg, ctx).at("selection");
      at::Tensor other = change_one_slot(fwd.at("selection"), scores, /*tied=*/false, 1e-9);
      if (!other.defined()) continue;
      ++changed_cases;
      forced.set("selection", other);
      TensorMap ref2 = m.reference(forced, c.cfg, ctx);
      EXPECT_TRUE(at::equal(ref2.at("selection"), other)) << name << " " << c.label;
      EXPECT_GT(rel(ref.at("y"), ref2.at("y")), 1e-9) << name << " " << c.label;
    }
    EXPECT_GE(changed_cases, 2) << name;
  }
}

// The reference's own selection is the block_topk / dsa_indexer selection of its candidate scores:
// the selection check accepts it against itself and against the forward's at fp64; one slot
// changed to a candidate of a clearly different score fails the check; changed to a candidate of
// exactly the same score it is accepted as a tie swap.
TEST(SparseSelection, ChangedSlotFailsTheSelectionCheckUnlessTied) {
  c10::NoGradGuard ng;
  for (const auto& name : kSparse) {
    const MethodSpec& m = Registry::get().method(name);
    const CaseDef c = short_cases(m, 45).back();
    LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
    TensorMap in = layer_inputs(m, c, 12);
    const at::Tensor own = m.reference(in, c.cfg, ctx).at("selection");
    const at::Tensor scores = method_selection(name)->scores(in, c.cfg, ctx).at("selection");
    const at::Tensor fwd = m.forward(in, c.cfg, ctx, Backend::CPU).at("selection");
    const double tol = conformance_detail::tie_tolerance("fp64");
    EXPECT_EQ(conformance_detail::compare_selection_ties(own, fwd, scores, tol).cmp.rel_rms, 0.0) << name;
    at::Tensor bad = change_one_slot(own, scores, /*tied=*/false, 1e-6);
    ASSERT_TRUE(bad.defined()) << name;
    auto cmp = conformance_detail::compare_selection_ties(own, bad, scores, tol);
    EXPECT_GT(cmp.cmp.rel_rms, 0.0) << name;
    Json j = conformance_detail::selection_check("selection", own, bad, scores, tol);
    EXPECT_EQ(j["status"], "fail") << name;
    // A tie: in the changed row, the lowest-scoring selected block (the k-th score) exchanged for
    // a candidate left out, whose score is edited to equal it.
    at::Tensor tied_scores = scores.clone(), tied = own.clone();
    {
      const int64_t k = own.size(-1), n = scores.size(-1);
      at::Tensor o = own.reshape({-1, k}), ts = tied_scores.view({-1, n}), tb = tied.view({-1, k});
      const int64_t row = (o != bad.reshape({-1, k})).any(-1).nonzero()[0][0].item<int64_t>();
      auto sc = ts[row];
      int64_t low_slot = -1;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = o[row][j].item<int64_t>();
        if (i < 0 || !std::isfinite(sc[i].item<double>())) continue;
        if (low_slot < 0 || sc[i].item<double>() < sc[o[row][low_slot].item<int64_t>()].item<double>()) low_slot = j;
      }
      ASSERT_GE(low_slot, 0) << name;
      int64_t out_c = -1;
      for (int64_t cnd = 0; cnd < n && out_c < 0; ++cnd)
        if (std::isfinite(sc[cnd].item<double>()) && !(o[row] == cnd).any().item<bool>()) out_c = cnd;
      ASSERT_GE(out_c, 0) << name;
      const int64_t was = o[row][low_slot].item<int64_t>();
      sc[out_c] = sc[was].item<double>();
      tb[row][low_slot] = out_c;
    }
    auto tie = conformance_detail::compare_selection_ties(own, tied, tied_scores, tol);
    EXPECT_EQ(tie.cmp.rel_rms, 0.0) << name;
    EXPECT_EQ(tie.tie_swaps, 1) << name;
  }
}

// Layer conformance (CPU, fp32): the reference attends with the optimized path's selection; the
// row says so, the selection check says what it compared; with an output fault the selection check
// fails (one key dropped per row).
TEST(SparseSelection, LayerConformanceReportsTheForcedSelection) {
  const MethodSpec& m = Registry::get().method("moba");
  ConformanceOptions opt;
  opt.dtype = "fp32";
  opt.finite_differences = false;
  for (const std::string fault : {"", "output"}) {
    opt.fault = fault;
    ConformanceSummary s;
    Json rows = conformance_detail::run_subjects({conformance_detail::layer_subject(m, opt)}, opt, s);
    ASSERT_FALSE(rows.empty());
    for (const auto& r : rows) {
      if (r["level"] != "layer") continue;
      EXPECT_EQ(r.value("reference_selection", ""), "optimized") << r.dump();
      int selection_checks = 0;
      for (const auto& c : r["checks"])
        if (c["kind"] == "selection") {
          ++selection_checks;
          EXPECT_EQ(c["tensor"], "selection");
          EXPECT_EQ(c.value("compared_with", ""), "reference's own");
          EXPECT_TRUE(c.contains("tie_swaps"));
          EXPECT_EQ(c["status"], fault.empty() ? "pass" : "fail") << c.dump();
        }
      EXPECT_EQ(selection_checks, 1) << r.dump();
      EXPECT_EQ(r["status"], fault.empty() ? "pass" : "fail") << r.dump();
    }
  }
}

// FP64: the teachers computed in query chunks smaller than T equal the unchunked ones (one chunk)
// to rounding, and seer's equals the full [B,H,T,T] computation it replaces.
TEST(SparseSelection, ChunkedTeachersEqualUnchunked) {
  c10::NoGradGuard ng;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t B = 2, T = 53, H = 4, Hkv = 2, dh = 8, bs = 5, NC = T / bs;
  const double scale = 1.0 / std::sqrt(double(dh));
  at::Tensor q = at::randn({B, T, H, dh}, gen, o), k = at::randn({B, T, Hkv, dh}, gen, o);
  const at::Tensor whole = sparse_layer::seer_teacher(q, k, bs, scale, T);
  // the earlier computation: full causal attention [B,H,T,T], block max, renormalised over i < t/bs
  {
    at::Tensor qh = q.reshape({B, T, Hkv, 2, dh}).permute({0, 2, 3, 1, 4}).reshape({B, Hkv, 2 * T, dh});
    at::Tensor lg = (at::matmul(qh, k.permute({0, 2, 3, 1})) * scale).view({B, H, T, T});
    at::Tensor A = at::softmax(lg.masked_fill(at::ones({T, T}, o.dtype(at::kBool)).triu(1), -INFINITY), -1);
    at::Tensor valid = at::arange(NC).view({1, NC}) < at::div(at::arange(T), bs, "floor").view({T, 1});
    at::Tensor gt = std::get<0>(A.narrow(3, 0, NC * bs).view({B, H, T, NC, bs}).max(-1)).masked_fill(valid.logical_not(), 0.0);
    gt = gt / gt.sum(-1, true).clamp_min(1e-30);
    EXPECT_LT((gt - whole).abs().max().item<double>(), 1e-15);
  }
  for (int64_t chunk : {1, 7, 16, 52}) {
    at::Tensor part = sparse_layer::seer_teacher(q, k, bs, scale, chunk);
    EXPECT_LT((part - whole).abs().max().item<double>(), 1e-15) << chunk;
  }
  // qsa: a selection of 3 history blocks (block_topk of random scores) plus the own block
  at::Tensor sel = block_topk_cpu(at::randn({B, 1, T, NC}, gen, o), bs, 3, false).squeeze(1);  // [B,T,4]
  const at::Tensor qwhole = sparse_layer::qsa_teacher(q, k, sel, bs, scale, T);
  ASSERT_EQ(qwhole.sizes(), (std::vector<int64_t>{B, T, 3}));
  EXPECT_GT(qwhole.abs().sum().item<double>(), 1.0);
  for (int64_t chunk : {1, 6, 25})
    EXPECT_LT((sparse_layer::qsa_teacher(q, k, sel, bs, scale, chunk) - qwhole).abs().max().item<double>(), 1e-15)
        << chunk;
  // the default chunking: at least one row, the budget over the bytes per row
  EXPECT_EQ(sparse_layer::chunk_rows(1e30), 1);
  EXPECT_EQ(sparse_layer::chunk_rows(double(sparse_layer::kChunkBytes) / 10.0), 10);
}

// The layers run no checked op (call_op, whose input checks read values back to the host) on their
// forward and backward path: the unchecked *_fast entry points only, so that a CUDA graph can hold a
// training step. Counted over each method's cases, the warm-up step included.
TEST(SparseSelection, LayersCallNoCheckedOp) {
  for (const auto& name : kSparse) {
    const MethodSpec& m = Registry::get().method(name);
    for (const CaseDef& c : short_cases(m, 45)) {
      TensorMap in = layer_inputs(m, c, 13);
      std::vector<at::Tensor> leaves;
      for (const auto& [n, t] : in)
        if (n != "ve") {
          t.requires_grad_(true);
          leaves.push_back(t);
        }
      for (int64_t step : {int64_t(-1), int64_t(0), int64_t(5)}) {
        LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
        ctx.step = step;
        Config cfg = c.cfg.has("full_attention_warmup_steps") ? c.cfg.with("full_attention_warmup_steps", int64_t(2)) : c.cfg;
        const int64_t before = call_op_count();
        TensorMap out = m.forward(in, cfg, ctx, Backend::CPU);
        at::Tensor loss = out.at("y").pow(2).sum();
        if (out.has("aux_loss")) loss = loss + out.at("aux_loss");
        torch::autograd::grad({loss}, leaves, {}, false, false, /*allow_unused=*/true);
        EXPECT_EQ(call_op_count(), before) << name << " " << c.label << " step " << step;
      }
    }
  }
  // the counter counts: a checked op call moves it
  const int64_t before = call_op_count();
  at::Tensor s = at::randn({1, 1, 8, 2}, at::TensorOptions().dtype(at::kDouble));
  Config p = Registry::get().op("block_topk").params.defaults();
  call_op("block_topk", Backend::CPU, {{"scores", s}}, p);
  EXPECT_EQ(call_op_count(), before + 1);
}

// A per-row tolerance widens the ties: two blocks 0.01 apart are a tie only within it.
TEST(SparseSelection, RowToleranceWidensTies) {
  auto i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor scores = at::tensor({3.0, 1.0, 0.99, -INFINITY}, at::TensorOptions().dtype(at::kDouble)).view({1, 4});
  const at::Tensor ref = at::tensor({0, 1}, i64).view({1, 2}), x = at::tensor({0, 2}, i64).view({1, 2});
  EXPECT_GT(conformance_detail::compare_selection_ties(ref, x, scores, 1e-12).cmp.rel_rms, 0.0);
  EXPECT_GT(conformance_detail::compare_selection_ties(ref, x, scores, 1e-12, at::full({1}, 0.005, at::kDouble)).cmp.rel_rms, 0.0);
  auto wide = conformance_detail::compare_selection_ties(ref, x, scores, 1e-12, at::full({1}, 0.02, at::kDouble));
  EXPECT_EQ(wide.cmp.rel_rms, 0.0);
  EXPECT_EQ(wide.tie_swaps, 1);
}

// bf16 on the CPU: every sparse layer's selection check passes, ties measured by the reference's
// own scores in bf16 (tie_tolerance "baseline"), the reference on the optimized path's selection.
TEST(SparseSelection, Bf16SelectionChecksPassOnTheCpu) {
  ConformanceOptions opt;
  opt.dtype = "bf16";
  opt.finite_differences = false;
  for (const auto& name : kSparse) {
    ConformanceSummary s;
    Json rows = conformance_detail::run_subjects({conformance_detail::layer_subject(Registry::get().method(name), opt)}, opt, s);
    EXPECT_EQ(s.errors, 0) << name;
    int checks = 0;
    for (const auto& r : rows) {
      if (r["level"] != "layer") continue;
      EXPECT_EQ(r.value("reference_selection", ""), "optimized") << r.dump();
      for (const auto& c : r["checks"])
        if (c["kind"] == "selection") {
          ++checks;
          EXPECT_EQ(c["status"], "pass") << name << " " << r["case"] << " " << c.dump();
          EXPECT_EQ(c.value("tie_tolerance", ""), "baseline") << c.dump();
        }
    }
    EXPECT_GE(checks, 7) << name;
  }
}
