// The backbone's extension points: execution plans (a block applied several times, its own cache
// slot per application, LayerCtx's iteration fields, FLOPs per application and parameters per
// block) and residual streams (parameters and update rule owned by the stream).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/plan.h"
#include "harness/registry.h"
#include "harness/residual.h"
#include "suites/optimizer.h"

namespace mixbench {
namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);
at::Generator gen_of(uint64_t s) { return at::make_generator<at::CPUGeneratorImpl>(s); }

TEST(ExecPlan, StackAndLoops) {
  ExecPlan s = ExecPlan::stack(3);
  ASSERT_EQ(s.n_steps(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s.steps[size_t(i)].block, i);
    EXPECT_EQ(s.steps[size_t(i)].slot, i);
    EXPECT_EQ(s.steps[size_t(i)].iteration, 0);
    EXPECT_EQ(s.steps[size_t(i)].n_iterations, 1);
  }
  ExecPlan l = ExecPlan::from_blocks(3, {0, 1, 1, 1, 2});
  EXPECT_EQ(l.n_steps(), 5);
  EXPECT_EQ(l.n_slots, 5);
  EXPECT_EQ(l.steps[3].block, 1);
  EXPECT_EQ(l.steps[3].iteration, 2);
  EXPECT_EQ(l.steps[3].n_iterations, 3);
  EXPECT_EQ(l.steps[4].iteration, 0);
}

TEST(ExecPlan, InvalidPlansAreInputErrors) {
  EXPECT_THROW(ExecPlan::from_blocks(2, {0, 0}), InputError);     // block 1 never applied
  EXPECT_THROW(ExecPlan::from_blocks(2, {0, 2, 1}), InputError);  // block out of range
  EXPECT_THROW(ExecPlan::from_blocks(0, {}), InputError);
  ExecPlan p = ExecPlan::stack(2);
  p.steps[1].slot = 0;  // two steps share a slot
  EXPECT_THROW(p.validate(), InputError);
  p = ExecPlan::stack(2);
  p.steps.push_back({1, 2, 0, 1});  // a second application that calls itself the first
  p.n_slots = 3;
  EXPECT_THROW(p.validate(), InputError);
}

// dense_full with a plan that runs block 1 three times: {0, 1, 1, 1}.
struct Looped {
  MethodSpec spec;
  Config cfg;
  std::vector<std::pair<int64_t, int64_t>>* seen = nullptr;  // (iteration, n_iterations) per forward call
};
Looped looped_dense(std::vector<std::pair<int64_t, int64_t>>* seen) {
  Looped l;
  l.spec = Registry::get().method("dense_full");
  l.spec.name = "dense_full";  // the layer method keeps its name (NVTX ranges, checkpoints)
  l.spec.plan = [](const Config&) { return ExecPlan::from_blocks(2, {0, 1, 1, 1}); };
  auto fwd = l.spec.forward;
  l.spec.forward = [fwd, seen](const TensorMap& in, const Config& c, const LayerCtx& ctx, Backend b) {
    if (seen) seen->push_back({ctx.iteration, ctx.n_iterations});
    return fwd(in, c, ctx, b);
  };
  l.cfg = l.spec.config.parse("n_layer=2,d_model=32,head_dim=16,vocab=32,seq_len=32");
  return l;
}

TEST(ExecPlan, LoopedModelRunsEachApplicationWithItsIteration) {
  std::vector<std::pair<int64_t, int64_t>> seen;
  Looped l = looped_dense(&seen);
  at::Generator g = gen_of(7);
  Model m = build_model(l.spec, l.cfg, g, kF64, /*random_nonzero=*/true);
  EXPECT_EQ(m.plan.n_steps(), 4);
  EXPECT_EQ(m.params.at("resid_lambdas").numel(), 4) << "one residual scale per application";
  EXPECT_FALSE(m.params.has("layers.2.mlp.c_fc")) << "parameters per block, not per application";
  at::Tensor idx = at::randint(32, {2, 9}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor y = model_forward(m, idx, Backend::CPU);
  ASSERT_EQ(seen.size(), 4u);
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 1}, {0, 3}, {1, 3}, {2, 3}};
  EXPECT_EQ(seen, want);
  // the loop matters: the same model without repeats computes something else
  Looped once = looped_dense(nullptr);
  once.spec.plan = nullptr;
  at::Generator g2 = gen_of(7);
  Model m2 = build_model(once.spec, once.cfg, g2, kF64, true);
  for (const auto& [n, t] : m2.params)
    if (n != "resid_lambdas" && n != "x0_lambdas") m2.params.set(n, m.params.at(n));
  m2.params.set("resid_lambdas", m.params.at("resid_lambdas").slice(0, 0, 2));
  m2.params.set("x0_lambdas", m.params.at("x0_lambdas").slice(0, 0, 2));
  EXPECT_GT((model_forward(m2, idx, Backend::CPU) - y).abs().max().item<double>(), 1e-6);
  // reference and optimized paths agree on the looped model
  at::Tensor r = model_forward(m, idx, Backend::Reference);
  EXPECT_LT((r - y).abs().max().item<double>(), 1e-10);
}

TEST(ExecPlan, LoopedDecodeKeepsOneCachePerApplication) {
  Looped l = looped_dense(nullptr);
  at::Generator g = gen_of(11);
  Model m = build_model(l.spec, l.cfg, g, kF64, true);
  at::Tensor idx = at::randint(32, {2, 12}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor full = model_forward(m, idx, Backend::CPU);
  ModelCache cache;
  at::Tensor pre = model_prefill(m, idx.slice(1, 0, 9), Backend::CPU, &cache);
  ASSERT_EQ(cache.layers.size(), 4u);
  EXPECT_LT((pre - full.slice(1, 8, 9)).abs().max().item<double>(), 1e-10);
  for (int64_t t = 9; t < 12; ++t) {
    at::Tensor s = model_decode_step(m, idx.slice(1, t, t + 1), cache, Backend::CPU);
    EXPECT_LT((s - full.slice(1, t, t + 1)).abs().max().item<double>(), 1e-10) << "t=" << t;
  }
  // the three applications of block 1 hold different keys
  EXPECT_GT((cache.layers[1].at("k") - cache.layers[2].at("k")).abs().max().item<double>(), 1e-6);
}

TEST(ExecPlan, AccountantCountsFlopsPerApplicationAndParamsPerBlock) {
  Looped l = looped_dense(nullptr);
  Looped once = looped_dense(nullptr);
  once.spec.plan = nullptr;
  CostQuery q;
  q.T = 32;
  q.context = 32;
  ModelCost a = account_model(l.spec, l.cfg, q), b = account_model(once.spec, once.cfg, q);
  // parameters: the same blocks, two more residual and two more x0 scales
  EXPECT_EQ(a.params.total(), b.params.total() + 4);
  EXPECT_EQ(a.params.matmul, b.params.matmul);
  ASSERT_EQ(a.layers.size(), 4u);
  ASSERT_EQ(a.steps.size(), 4u);
  // forward FLOPs: block 1 (mixer and MLP) twice more
  const ModelDims d = model_dims(l.cfg);
  const double block1 = b.layers[1].fwd_flops + 2.0 * 2.0 * double(d.d_model * d.mlp_hidden);
  EXPECT_NEAR(a.fwd_flops - b.fwd_flops, 2.0 * block1, 1e-6 * a.fwd_flops);
  EXPECT_GT(a.train_flops_nanochat, b.train_flops_nanochat);
  EXPECT_NEAR(a.cache_bytes_per_token, 2.0 * b.cache_bytes_per_token, 1e-9);
}

TEST(ExecPlan, PlanWithTheWrongBlockCountIsAnInputError) {
  Looped l = looped_dense(nullptr);
  l.spec.plan = [](const Config&) { return ExecPlan::from_blocks(3, {0, 1, 2}); };
  at::Generator g = gen_of(1);
  EXPECT_THROW(build_model(l.spec, l.cfg, g, kF64, true), InputError);
}

// A residual stream of the test's own: the plain pre-norm residual h ← h + F(norm(h)) with one
// learnable gain on every sublayer's output ("stream_gain") — parameters and update rule owned by
// the stream.
class GainStream final : public ResidualStream {
 public:
  std::string name() const override { return "gain"; }
  std::vector<ParamDef> params(const ModelDims&, const ExecPlan&) const override {
    return {{"stream_gain", {1}, ParamGroup::Scalar, false, "const", 1.0, 0,
             adamw_rule("stream_gain", 0.05, 0.8, 0.95, 0.0, false, false)}};
  }
  TensorMap begin(const at::Tensor& x, const TensorMap&, Backend) const override { return TensorMap{{"h", x}}; }
  at::Tensor read(TensorMap& st, const Sublayer&, const TensorMap&) const override { return st.at("h"); }
  void write(TensorMap& st, const Sublayer&, const at::Tensor& y, const TensorMap& P) const override {
    st.set("h", st.at("h") + P.at("stream_gain") * y);
  }
  at::Tensor finish(TensorMap& st, const TensorMap&, Backend) const override { return st.at("h"); }
};

TEST(ResidualStream, AStreamOwnsItsParametersAndUpdate) {
  MethodSpec spec = Registry::get().method("dense_full");
  spec.residual = [](const Config&) { return std::make_shared<GainStream>(); };
  const Config cfg = spec.config.parse("n_layer=3,d_model=32,head_dim=16,vocab=32,seq_len=32");
  at::Generator g = gen_of(3);
  Model m = build_model(spec, cfg, g, kF64, true);
  EXPECT_TRUE(m.params.has("stream_gain"));
  EXPECT_FALSE(m.params.has("resid_lambdas"));
  EXPECT_FALSE(m.params.has("backout_lambda"));
  EXPECT_EQ(m.stream->name(), "gain");

  // The same model under nanochat's stream with resid = 1, x0 = 0, backout = 0 computes the plain
  // residual, so both agree when the gain is 1.
  MethodSpec plain = Registry::get().method("dense_full");
  at::Generator g2 = gen_of(3);
  Model n = build_model(plain, cfg, g2, kF64, true);
  for (const auto& [name, t] : m.params)
    if (name != "stream_gain") n.params.set(name, t);
  n.params.set("resid_lambdas", at::ones({3}, kF64));
  n.params.set("x0_lambdas", at::zeros({3}, kF64));
  n.params.set("backout_lambda", at::zeros({1}, kF64));
  m.params.set("stream_gain", at::ones({1}, kF64));
  at::Tensor idx = at::randint(32, {1, 10}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor a = model_forward(m, idx, Backend::CPU), b = model_forward(n, idx, Backend::CPU);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-12);
  // and the stream's parameter acts
  m.params.set("stream_gain", at::full({1}, 0.5, kF64));
  EXPECT_GT((model_forward(m, idx, Backend::CPU) - b).abs().max().item<double>(), 1e-6);
  // the accountant counts the stream's parameter
  CostQuery q;
  q.T = 32;
  EXPECT_EQ(account_model(spec, cfg, q).params.total(), count_params(m).total());
}

}  // namespace
}  // namespace mixbench

namespace mixbench {
namespace {

// A backbone parameter the optimizer has never seen, declared by a residual stream with its group
// and init rule, trains with the real optimizer: no edit to it.
TEST(ResidualStream, AStreamParameterTrainsInItsDeclaredGroup) {
  MethodSpec spec = Registry::get().method("dense_full");
  spec.residual = [](const Config&) { return std::make_shared<GainStream>(); };
  const Config cfg = spec.config.parse("n_layer=2,d_model=32,head_dim=16,vocab=32,seq_len=16");
  at::Generator g = gen_of(5);
  Model m = build_model(spec, cfg, g, at::TensorOptions().dtype(at::kFloat));  // training init
  ASSERT_EQ(m.params.at("stream_gain").item<float>(), 1.0f) << "the declared init rule";
  for (const auto& [n, t] : m.params) t.requires_grad_(true);
  TrainHyper h;
  h.schedule.steps = 3;
  h.schedule.warmup = 1;
  Optimizer opt(m, 2 * 16, h);
  EXPECT_EQ(opt.group_of("stream_gain"), "stream_gain");
  EXPECT_EQ(opt.base_lr("stream_gain"), 0.05);
  at::Tensor idx = at::randint(32, {2, 16}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor tgt = at::randint(32, {2, 16}, g, at::TensorOptions().dtype(at::kLong));
  for (int64_t it = 0; it < 3; ++it) {
    for (const auto& [n, t] : m.params)
      if (t.grad().defined()) t.mutable_grad().reset();
    model_loss(m, idx, tgt, Backend::CPU).backward();
    ASSERT_TRUE(m.params.at("stream_gain").grad().defined());
    opt.step(m, it);
  }
  EXPECT_NE(m.params.at("stream_gain").item<float>(), 1.0f) << "the stream's parameter trained";
  EXPECT_TRUE(opt.state().has("m1.stream_gain"));
}

}  // namespace
}  // namespace mixbench

namespace mixbench {
namespace {

// A stream sees each pass's backend and may leave an auxiliary loss (a ponder cost, a router
// loss) that the model adds to the layers' auxiliary losses.
class PonderStream final : public ResidualStream {
 public:
  std::string name() const override { return "ponder"; }
  std::vector<ParamDef> params(const ModelDims&, const ExecPlan&) const override { return {}; }
  double fwd_flops(const ModelDims&, const ExecPlan& plan) const override { return 100.0 * plan.n_steps(); }
  double act_bytes(const ModelDims&, const ExecPlan&, int64_t dtype_bytes) const override { return 7.0 * dtype_bytes; }
  TensorMap begin(const at::Tensor& x, const TensorMap&, Backend b) const override {
    return TensorMap{{"h", x}, {"ref", at::full({}, b == Backend::Reference ? 1.0 : 0.0, x.options())}};
  }
  at::Tensor read(TensorMap& st, const Sublayer&, const TensorMap&) const override { return st.at("h"); }
  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap&) const override {
    st.set("h", st.at("h") + y);
    st.set("iters", st.get_or("iters", at::zeros({}, y.options())) + double(s.n_iterations));
  }
  at::Tensor finish(TensorMap& st, const TensorMap&, Backend) const override {
    st.set("aux_loss", 0.25 * st.at("ref") + st.at("iters"));
    return st.at("h");
  }
};

TEST(ResidualStream, StreamSeesTheBackendAndAddsItsAuxLoss) {
  MethodSpec spec = Registry::get().method("dense_full");
  spec.residual = [](const Config&) { return std::make_shared<PonderStream>(); };
  const Config cfg = spec.config.parse("n_layer=2,d_model=32,head_dim=16,vocab=32,seq_len=16");
  at::Generator g = gen_of(9);
  Model m = build_model(spec, cfg, g, kF64, true);
  at::Tensor idx = at::randint(32, {1, 8}, g, at::TensorOptions().dtype(at::kLong));
  ModelAux cpu, ref;
  model_forward(m, idx, Backend::CPU, &cpu);
  model_forward(m, idx, Backend::Reference, &ref);
  ASSERT_TRUE(cpu.aux_loss.defined());
  // 2 blocks × 2 sublayers, each applied once; the reference pass adds 0.25
  EXPECT_DOUBLE_EQ(cpu.aux_loss.item<double>(), 4.0);
  EXPECT_DOUBLE_EQ(ref.aux_loss.item<double>(), 4.25);
  // the accountant bills the stream's arithmetic and its activations
  CostQuery q;
  q.T = 16;
  const ModelCost with = account_model(spec, cfg, q), without = account_model(Registry::get().method("dense_full"), cfg, q);
  EXPECT_DOUBLE_EQ(with.fwd_flops - without.fwd_flops, 200.0);
  EXPECT_DOUBLE_EQ(with.train_flops_nanochat - without.train_flops_nanochat, 600.0);
  EXPECT_DOUBLE_EQ(with.act_bytes - without.act_bytes, 7.0 * q.dtype_bytes);
}

}  // namespace
}  // namespace mixbench

namespace mixbench {
namespace {

// nanochat's stream with its backout read at a chosen step: the midpoint step reproduces the
// default, another step changes the logits.
TEST(ResidualStream, BackoutStepIsChosenPerMethod) {
  MethodSpec spec = Registry::get().method("dense_full");
  const Config cfg = spec.config.parse("n_layer=4,d_model=32,head_dim=16,vocab=32,seq_len=16");
  at::Generator g = gen_of(11);
  Model m = build_model(spec, cfg, g, kF64, true);
  at::Tensor idx = at::randint(32, {1, 8}, g, at::TensorOptions().dtype(at::kLong));
  const at::Tensor base = model_forward(m, idx, Backend::CPU);
  m.stream = nanochat_stream(2);  // the midpoint of 4 steps
  EXPECT_LT((model_forward(m, idx, Backend::CPU) - base).abs().max().item<double>(), 1e-12);
  m.stream = nanochat_stream(0);
  EXPECT_GT((model_forward(m, idx, Backend::CPU) - base).abs().max().item<double>(), 1e-6);
}

}  // namespace
}  // namespace mixbench
