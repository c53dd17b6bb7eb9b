// Block selections that tie (op block_topk, the selection of moba, nsa, seer and qsa): a selection
// that keeps other blocks tied with the k-th score is accepted and counted as tie swaps, one that
// drops a block strictly above the boundary or the forced own block fails — one test per
// flavour of block score, the op's conformance, and golden files written with torch.topk. Also
// seer's gate keys: pooled before RoPE and rotated at the block's first position (the original
// AttnGate), with seer_gate_keys=rotated reproducing the earlier gate.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>
#include <unistd.h>

#include "tests/source_dir.h"
#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "mixers/common/layers.h"
#include "mixers/sparse/sparse_method.h"
#include "suites/conformance.h"
#include "suites/conformance_checks.h"
#include "suites/golden.h"
#include "suites/model_golden.h"

namespace fs = std::filesystem;
using namespace mixbench;
using namespace mixbench::conformance_detail;

namespace {

const fs::path kGoldens = fs::path(mixbench_test::source_dir()) / "tests" / "goldens";

at::Generator gen_of(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }
at::TensorOptions f64() { return at::TensorOptions().dtype(at::kDouble); }

Config topk_params(int64_t bs, int64_t topk, const std::string& own) {
  return Registry::get().op("block_topk").params.defaults().with("block_size", bs).with("topk", topk).with("own", own);
}

// The op's selection of `scores` (both paths agree exactly: ties to the lower block) and the
// candidates' scores the check reads (−inf none, +inf the forced own block).
std::pair<at::Tensor, at::Tensor> select(const at::Tensor& scores, int64_t bs, int64_t topk, const std::string& own) {
  const OpSpec& op = Registry::get().op("block_topk");
  const Config p = topk_params(bs, topk, own);
  const TensorMap in{{"scores", scores}};
  at::Tensor sel = op.cpu(in, p).at("block_indices");
  EXPECT_TRUE(at::equal(sel, op.reference(in, p).at("block_indices")));
  return {sel, op.selection_scores(in, p).at("block_indices")};
}

// Rows of a selection [..., K] and of its candidates' scores [..., W], for element access.
struct Rows {
  at::Tensor sel, sc;
  int64_t n, K, W;
  Rows(const at::Tensor& s, const at::Tensor& c)
      : sel(s.reshape({-1, s.size(-1)}).clone()), sc(c.reshape({-1, c.size(-1)}).contiguous()),
        n(sel.size(0)), K(sel.size(1)), W(sc.size(1)) {}
  int64_t& at_(int64_t r, int64_t j) { return sel.data_ptr<int64_t>()[r * K + j]; }
  double score(int64_t r, int64_t b) const { return sc.data_ptr<double>()[r * W + b]; }
  std::set<int64_t> chosen(int64_t r) {
    std::set<int64_t> s;
    for (int64_t j = 0; j < K; ++j)
      if (at_(r, j) >= 0) s.insert(at_(r, j));
    return s;
  }
  // The lowest finite score selected (the boundary), +inf when the row selects only forced blocks.
  double kth(int64_t r) {
    double k = std::numeric_limits<double>::infinity();
    for (int64_t b : chosen(r))
      if (std::isfinite(score(r, b))) k = std::min(k, score(r, b));
    return k;
  }
  at::Tensor out(const at::Tensor& like) const { return sel.view(like.sizes()); }
};

// Every row's selected blocks tied (exactly) with its k-th score exchanged for the highest tied
// blocks, where the stable sort keeps the lowest: the number of blocks exchanged.
int64_t keep_last_tied(at::Tensor& sel, const at::Tensor& cand) {
  Rows R(sel, cand);
  int64_t swaps = 0;
  for (int64_t r = 0; r < R.n; ++r) {
    const double kth = R.kth(r);
    if (!std::isfinite(kth)) continue;
    const std::set<int64_t> before = R.chosen(r);
    std::vector<int64_t> tied;
    for (int64_t b = 0; b < R.W; ++b)
      if (R.score(r, b) == kth) tied.push_back(b);
    int64_t i = 0;
    for (int64_t j = 0; j < R.K; ++j)
      if (R.at_(r, j) >= 0 && R.score(r, R.at_(r, j)) == kth) {
        const int64_t b = tied[tied.size() - 1 - size_t(i++)];
        swaps += before.count(b) ? 0 : 1;
        R.at_(r, j) = b;
      }
  }
  sel = R.out(sel);
  return swaps;
}

// A block of `want` kind (strictly above the boundary: finite and > k-th; forced: +inf) exchanged
// for an unselected candidate tied with the k-th score (or below it), in every row that has both.
int64_t exchange(at::Tensor& sel, const at::Tensor& cand, bool forced) {
  Rows R(sel, cand);
  int64_t rows = 0;
  for (int64_t r = 0; r < R.n; ++r) {
    const double kth = R.kth(r);
    const std::set<int64_t> ch = R.chosen(r);
    int64_t spare = -1;
    for (int64_t b = 0; b < R.W && spare < 0; ++b)
      if (!ch.count(b) && std::isfinite(R.score(r, b)) && R.score(r, b) <= kth) spare = b;
    if (spare < 0) continue;
    for (int64_t j = 0; j < R.K; ++j) {
      const int64_t b = R.at_(r, j);
      if (b < 0) continue;
      const double s = R.score(r, b);
      if (forced ? std::isinf(s) && s > 0 : std::isfinite(s) && s > kth) {
        R.at_(r, j) = spare;
        ++rows;
        break;
      }
    }
  }
  sel = R.out(sel);
  return rows;
}

// torch.topk's selection over the candidates: per row the k best (k = the blocks `ref` selects).
at::Tensor topk_selection(const at::Tensor& ref, const at::Tensor& cand) {
  Rows R(ref, cand);
  for (int64_t r = 0; r < R.n; ++r) {
    const int64_t k = int64_t(R.chosen(r).size());
    at::Tensor idx = std::get<1>(at::topk(R.sc[r], k));
    for (int64_t j = 0; j < R.K; ++j) R.at_(r, j) = j < k ? idx[j].item<int64_t>() : -1;
  }
  return R.out(ref);
}

// The tie rule on one flavour's block scores: the tied selection passes with its swaps counted,
// torch.topk's passes, a strict or a forced exchange fails.
void expect_tie_rule(const at::Tensor& scores, int64_t bs, int64_t topk, const std::string& own) {
  auto [ref, cand] = select(scores, bs, topk, own);
  const double tol = tie_tolerance("fp64");
  at::Tensor tied = ref.clone();
  const int64_t swaps = keep_last_tied(tied, cand);
  ASSERT_GT(swaps, 0) << "the scores must tie at the boundary";
  EXPECT_GT(compare_selection(ref, tied).rel_rms, 0.0) << "the sets differ: only the tie rule accepts them";
  Json c = selection_check("block_indices", ref, tied, cand, tol);
  EXPECT_EQ(c["status"], "pass") << c.dump();
  EXPECT_EQ(c["tie_swaps"], swaps);
  EXPECT_EQ(selection_check("block_indices", ref, topk_selection(ref, cand), cand, tol)["status"], "pass");
  EXPECT_EQ(selection_check("block_indices", ref, tied, at::Tensor(), tol)["status"], "fail") << "exact without scores";

  at::Tensor strict = ref.clone(), forced = ref.clone();
  ASSERT_GT(exchange(strict, cand, false), 0);
  ASSERT_GT(exchange(forced, cand, true), 0);
  c = selection_check("block_indices", ref, strict, cand, tol);
  EXPECT_EQ(c["status"], "fail");
  EXPECT_EQ(c["tie_swaps"], 0);
  EXPECT_EQ(selection_check("block_indices", ref, forced, cand, tol)["status"], "fail") << "the own block is no tie";
  // a strict exchange among tie swaps still fails its row
  at::Tensor both = tied.clone();
  ASSERT_GT(exchange(both, cand, false), 0);
  EXPECT_EQ(selection_check("block_indices", ref, both, cand, tol)["status"], "fail");
}

// Keys (or gate keys) of blocks 1 … n_tied−1 copied from block 0, so that their scores tie exactly.
at::Tensor copy_block0(at::Tensor x, int64_t dim, int64_t bs, int64_t n_tied) {
  for (int64_t i = 1; i < n_tied; ++i) x.narrow(dim, i * bs, bs).copy_(x.narrow(dim, 0, bs));
  return x;
}

}  // namespace

// moba: s_t,i = q_t·mean(k over block i) per query head, the own block forced and counted.
TEST(BlockSelectionTies, MobaGateTopk) {
  at::Generator g = gen_of(1);
  const int64_t B = 1, T = 32, H = 2, dh = 4, bs = 4, NB = T / bs;
  at::Tensor q = at::randn({B, T, H, dh}, g, f64());
  at::Tensor k = copy_block0(at::randn({B, T, H, dh}, g, f64()), 1, bs, 3);
  at::Tensor kbar = k.view({B, NB, bs, H, dh}).mean(2);                     // [B,NB,H,dh]
  at::Tensor s = at::einsum("bthd,bihd->bhti", {q, kbar});                  // [B,H,T,NB]
  expect_tie_rule(s, bs, 3, "counted");
}

// nsa: compressed-attention probabilities over the visible compressed blocks, summed over the KV
// group's query heads, per KV head; own block appended.
TEST(BlockSelectionTies, NsaCompressedScoreTopk) {
  at::Generator g = gen_of(2);
  const int64_t B = 1, T = 32, Hkv = 1, G = 2, dh = 4, bs = 4, NC = T / bs;
  at::Tensor q = at::randn({B, T, Hkv * G, dh}, g, f64());
  at::Tensor kc = at::randn({B, NC, Hkv, dh}, g, f64());
  kc.narrow(1, 1, 2).copy_(kc.narrow(1, 0, 1).expand({B, 2, Hkv, dh}));  // three identical compressed keys
  at::Tensor lg = at::einsum("bthd,bid->bhti", {q, kc.select(2, 0)}) / std::sqrt(double(dh));  // [B,G,T,NC]
  at::Tensor vis = ((at::arange(NC) + 1) * bs - 1).view({1, NC}) <= at::arange(T).view({T, 1});
  at::Tensor p = at::softmax(lg.masked_fill(vis.logical_not(), -1e30), -1).masked_fill(vis.logical_not(), 0.0);
  expect_tie_rule(p.sum(1, true), bs, 2, "appended");                     // [B,Hkv,T,NC]
}

// seer: gate logits Q̃_t·K̃_i/√d_g per query head (three blocks with the same gate key); own block appended.
TEST(BlockSelectionTies, SeerGateTopk) {
  at::Generator g = gen_of(3);
  const int64_t B = 2, T = 24, H = 2, dg = 8, bs = 3, NC = T / bs;
  at::Tensor qg = at::randn({B, T, H, dg}, g, f64());
  at::Tensor kg = copy_block0(at::randn({B, NC, H, dg}, g, f64()), 1, 1, 3);
  expect_tie_rule(at::einsum("bthd,bihd->bhti", {qg, kg}) / std::sqrt(double(dg)), bs, 2, "appended");
}

// qsa: I_t,i = Σ_j ReLU(q_j·k_i/√d) over the indexer heads, shared by all heads: the blocks whose
// keys oppose every query score exactly 0; own block appended.
TEST(BlockSelectionTies, QsaIndexerTiedAtZero) {
  at::Generator g = gen_of(4);
  const int64_t B = 1, T = 40, HI = 2, DI = 4, bs = 4, NC = T / bs;
  at::Tensor q = at::randn({B, T, HI, DI}, g, f64()).abs();
  at::Tensor k = at::randn({B, NC, DI}, g, f64()).abs();
  k.narrow(1, 0, 4).neg_();  // blocks 0-3 score 0 for every query
  at::Tensor I = at::relu(at::einsum("bthd,bid->bthi", {q, k}) / std::sqrt(double(DI))).sum(2);  // [B,T,NC]
  ASSERT_GT((I == 0).sum().item<int64_t>(), 0);
  expect_tie_rule(I.unsqueeze(1), bs, 3, "appended");
}

// The op's conformance (its cases include ReLU-tied scores) passes at fp64 and fp32, its selection
// checks carry tie_swaps, and a dropped block fails.
TEST(BlockSelectionTies, OpConformance) {
  for (const char* dtype : {"fp64", "fp32"}) {
    ConformanceOptions opt;
    opt.ops = {"block_topk"};
    opt.dtype = dtype;
    opt.finite_differences = std::string(dtype) == "fp64";  // of the FP64 reference, once
    opt.fd_directions = 1;
    ConformanceSummary s;
    Json r = run_conformance(opt, s);
    EXPECT_EQ(s.failed + s.errors, 0) << dtype << r.dump();
    int selections = 0;
    for (const auto& x : r)
      for (const auto& c : x["checks"])
        if (c["kind"] == "selection") selections += c.contains("tie_swaps");
    EXPECT_GE(selections, 9) << dtype;
    opt.fault = "output";
    ConformanceSummary f;
    run_conformance(opt, f);
    EXPECT_GT(f.failed, 0) << dtype;
  }
}

// Golden files written by torch.topk (tests/goldens/make_block_topk_golden.py) keep other tied blocks
// than the stable sort: `conformance --golden` passes and reports the swaps; the same file with a
// block above the boundary exchanged fails.
TEST(BlockSelectionTies, TorchTopkGoldensPass) {
  const fs::path dir = fs::temp_directory_path() / ("mixbench_block_ties_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* name : {"torch_block_topk_appended_ties", "torch_block_topk_counted_ties"}) {
    const fs::path file = kGoldens / (std::string(name) + ".safetensors");
    const fs::path rep = dir / "report.json";
    testing::internal::CaptureStdout();
    const int rc = run_cli({"conformance", "--golden", file.string(), "--dtype", "fp32", "--out", rep.string(), "--quiet"});
    std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(rc, 0) << name << out;
    const Json r = Json::parse(read_file(rep.string()));
    int64_t swaps = -1;
    for (const auto& res : r["results"])
      if (res["backend"] == "reference")
        for (const auto& c : res["checks"])
          if (c["kind"] == "selection") swaps = c["tie_swaps"].get<int64_t>();
    EXPECT_GT(swaps, 0) << name;

    const GoldenFile g = read_golden(file.string());
    const at::Tensor want = g.file.tensors.at("expected_block_indices");
    at::Tensor strict = want.clone();
    ASSERT_GT(exchange(strict, g.op->selection_scores(g.inputs, g.config).at("block_indices"), false), 0);
    TensorMap t;
    for (const auto& [n, x] : g.file.tensors) t.set(n, n == "expected_block_indices" ? strict : x);
    const fs::path bad = dir / "strict.safetensors";
    write_safetensors(bad.string(), t, g.file.metadata);
    testing::internal::CaptureStdout();
    const int rc_bad = run_cli({"conformance", "--golden", bad.string(), "--quiet"});
    out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(rc_bad, 1) << name << out;
    for (const fs::path& p : {rep, bad}) fs::remove(p);
  }
  fs::remove(dir);  // (not remove_all: the one linked from libtorch crashes here)
}

TEST(BlockSelectionTies, BadScoresAreInputErrors) {
  const OpSpec& op = Registry::get().op("block_topk");
  const TensorMap in{{"scores", at::zeros({1, 1, 9, 4}, f64())}};  // 9 tokens: 3 blocks of 4
  EXPECT_THROW(op.cpu(in, topk_params(4, 2, "appended")), InputError);
  EXPECT_THROW(op.cpu({{"scores", at::zeros({1, 1, 9, 2}, f64())}}, topk_params(4, 2, "counted")), InputError);
  EXPECT_THROW(op.cpu({{"scores", at::zeros({1, 9, 2}, f64())}}, topk_params(4, 2, "appended")), InputError);
  EXPECT_NO_THROW(op.cpu({{"scores", at::zeros({1, 1, 9, 2}, f64())}}, topk_params(4, 2, "appended")));
}

// ------------------------------------------------------------------------------------ seer's gate

namespace {

// Rotation of x [N, …, D] (row n at position pos[n]) over its last dim, half-split, base `base`:
// sign +1 is nanochat's (y1 = x1 cos + x2 sin, y2 = x2 cos − x1 sin), −1 its inverse.
at::Tensor rotate(const at::Tensor& x, const std::vector<double>& pos, double base, int sign) {
  const int64_t D = x.size(-1), half = D / 2;
  std::vector<at::Tensor> rows;
  for (size_t n = 0; n < pos.size(); ++n) {
    at::Tensor r = x[int64_t(n)].clone();
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos[n] * std::pow(base, -2.0 * double(i) / double(D));
      at::Tensor x1 = x[int64_t(n)].select(-1, i), x2 = x[int64_t(n)].select(-1, half + i);
      r.select(-1, i).copy_(x1 * std::cos(a) + double(sign) * x2 * std::sin(a));
      r.select(-1, half + i).copy_(x2 * std::cos(a) - double(sign) * x1 * std::sin(a));
    }
    rows.push_back(r);
  }
  return at::stack(rows, 0);
}

// Seer's auxiliary loss computed by hand from the layer's q and k: gate keys from the max/min/mean
// of each block of `gate_keys` [B,T,Hkv,dh] through W^G_k, rotated at the block's first position
// when `rope`; token gate queries W^G_q q; KL from the block-max of full causal attention.
double seer_aux_by_hand(const TensorMap& in, const sparse_layer::QKV& a, const at::Tensor& gate_keys, int64_t bs,
                        double base, bool rope) {
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), dh = a.q.size(3), Hkv = a.k.size(2), G = H / Hkv;
  const at::Tensor &wq = in.at("seer_wq"), &wk = in.at("seer_wk");  // [H,dg,dh], [Hkv,dg,3dh]
  const int64_t dg = wq.size(1), NC = T / bs;
  double total = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> kg;
    std::vector<double> pos;
    for (int64_t i = 0; i < NC; ++i) {
      at::Tensor blk = gate_keys[b].narrow(0, i * bs, bs);  // [bs,Hkv,dh]
      at::Tensor pooled = at::cat({std::get<0>(blk.max(0)), std::get<0>(blk.min(0)), blk.mean(0)}, -1);
      kg.push_back(at::einsum("hgc,hc->hg", {wk, pooled}));  // [Hkv,dg]
      pos.push_back(double(i * bs));
    }
    at::Tensor K = NC > 0 ? at::stack(kg, 0) : at::Tensor();  // [NC,Hkv,dg]
    if (rope && NC > 0) K = rotate(K, pos, base, +1);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cur = t / bs;
      if (cur == 0) continue;
      for (int64_t h = 0; h < H; ++h) {
        at::Tensor qg = at::mv(wq[h], a.q[b][t][h]);                                  // [dg]
        at::Tensor S = at::mv(K.narrow(0, 0, cur).select(1, h / G), qg) / std::sqrt(double(dg));  // [cur]
        at::Tensor A = at::softmax(at::mv(a.k[b].narrow(0, 0, t + 1).select(1, h / G), a.q[b][t][h]) / std::sqrt(double(dh)), 0);
        at::Tensor gt = std::get<0>(A.narrow(0, 0, cur * bs).view({cur, bs}).max(1));
        gt = gt / gt.sum();
        total += (gt * (gt.log() - at::log_softmax(S, 0))).sum().item<double>();
      }
    }
  }
  return total / double(B * T * H);
}

}  // namespace

// The gate keys are the layer's keys BEFORE their rotation, pooled per block, projected, then rotated
// at the block's first position i·block (the original AttnGate); seer_gate_keys=rotated pools the
// rotated keys and does not rotate again. Both paths (optimized and FP64 reference) against a hand
// computation of the auxiliary loss, which reads the gate logits of every candidate block.
TEST(SeerGate, KeysPooledBeforeRopeAndRotatedAtTheBlockStart) {
  const MethodSpec& m = Registry::get().method("seer");
  const Config base = m.config.parse("n_layer=2,d_model=32,head_dim=8,seq_len=64,vocab=32,seer_block=4,seer_topk=2,"
                                     "seer_gate_dim=8,kv_ratio=2");
  EXPECT_EQ(base.s("seer_gate_keys"), "pooled_rope") << "the default follows the original";
  at::Generator g = gen_of(7);
  LayerCtx ctx{1, 2};
  TensorMap in = m.make_inputs(base, ctx, 2, 14, g);
  for (const auto& d : m.params(base, ctx)) in.set(d.name, random_param(d, g, f64()));
  c10::NoGradGuard ng;
  const sparse_layer::QKV a = sparse_layer::qkv(in, base);
  // the unrotated keys: the layer's keys rotated back, position by position
  std::vector<double> pos;
  for (int64_t t = 0; t < a.k.size(1); ++t) pos.push_back(double(t));
  at::Tensor k0 = rotate(a.k.transpose(0, 1), pos, base.f("rope_base"), -1).transpose(0, 1);
  EXPECT_LT((k0 - layers::rms_norm(a.k_raw) * 1.2).abs().max().item<double>(), 1e-12);

  double aux[2];
  for (int rotated = 0; rotated < 2; ++rotated) {
    const Config c = rotated ? base.with("seer_gate_keys", std::string("rotated")) : base;
    const double want = rotated ? seer_aux_by_hand(in, a, a.k, 4, c.f("rope_base"), false)
                                : seer_aux_by_hand(in, a, k0, 4, c.f("rope_base"), true);
    const double fast = m.forward(in, c, ctx, Backend::CPU).at("aux_loss").item<double>();
    const double ref = m.reference(in, c, ctx).at("aux_loss").item<double>();
    EXPECT_NEAR(fast, want, 1e-12 * std::abs(want)) << (rotated ? "rotated" : "pooled_rope");
    EXPECT_NEAR(ref, want, 1e-12 * std::abs(want)) << (rotated ? "rotated" : "pooled_rope");
    aux[rotated] = want;
  }
  EXPECT_GT(std::abs(aux[0] - aux[1]), 1e-6 * std::abs(aux[1])) << "the two gates must differ";
}

// seer_gate_keys=rotated reproduces the earlier gate: the model golden written before the default
// changed (tests/data/seer_gate_keys_rotated.safetensors, its config naming the option) matches.
TEST(SeerGate, RotatedOptionReproducesTheEarlierNumbers) {
  const std::vector<GoldenDiff> diffs = check_model_golden((kGoldens.parent_path() / "data" / "seer_gate_keys_rotated.safetensors").string());
  ASSERT_GT(diffs.size(), size_t(9));
  for (const auto& d : diffs) EXPECT_TRUE(d.pass) << d.tensor << " rel " << d.rel;
}

TEST(SeerGate, RotatedPooledKeysNeedAnEvenGateDim) {
  const ConfigSpec& spec = Registry::get().method("seer").config;
  const std::string shape = "n_layer=2,d_model=32,head_dim=8,seq_len=64,vocab=32,seer_gate_dim=7";
  EXPECT_THROW(spec.parse(shape), InputError);
  EXPECT_NO_THROW(spec.parse(shape + ",seer_gate_keys=rotated"));
  EXPECT_THROW(spec.parse(shape + ",seer_gate_keys=pooled"), InputError);
}
