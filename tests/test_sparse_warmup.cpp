// The sparse methods' full-attention warm-up as a fraction of the run: the trainer resolves
// full_attention_warmup_frac against the run's steps (an explicit full_attention_warmup_steps
// overrides it), and refuses a warm-up covering every step unless allow_full_warmup=1.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "suites/train.h"
#include "suites/budgets.h"
#include "suites/train_presets.h"

using namespace mixbench;

namespace {
const std::string kShape = "n_layer=2,d_model=64,head_dim=32,seq_len=32,dsa_topk=8,idx_heads=2,idx_dim=8,idx_rope_dim=4";

TrainOptions dsa_run(const std::string& extra, int64_t steps) {
  TrainOptions o;
  o.method = "dsa";
  o.config = kShape + extra;
  o.steps = steps;
  o.batch = 2;
  o.eval_every = steps;
  o.eval_batches = 1;
  o.probe_sequences = 0;
  return o;
}

std::string usage_error(const TrainOptions& o) {
  try {
    run_train(o);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// Every preset's sparse methods warm up for part of the run only: in tiny (160 steps) the default
// fraction (seed 001's 512 of 46,875 updates) is 2 steps, where 512 steps covered the whole run.
TEST(SparseWarmup, EveryPresetWarmsUpForPartOfTheRun) {
  for (const char* preset : {"tiny", "small", "gpu-d12"}) {
    const TrainPreset P = train_preset(preset);
    for (const char* method : {"dsa", "qsa", "seer", "qsa_hybrid"}) {
      const MethodSpec& ms = Registry::get().method(method);
      TrainOptions o;  // the run's length: the preset's steps or its budget
      o.method = method;
      o.preset = preset;
      const int64_t steps = run_length(o, P).steps;
      ASSERT_GT(steps, 0) << preset;
      const Config cfg = resolve_full_attention_warmup(ms.config.parse(P.config_for(method)), steps);
      const int64_t n = cfg.i("full_attention_warmup_steps");
      EXPECT_GE(n, 0) << preset << " " << method;
      EXPECT_LT(n, steps) << preset << " " << method;
    }
  }
  const TrainPreset tiny = train_preset("tiny");
  const Config dsa = Registry::get().method("dsa").config.parse(tiny.config_for("dsa"));
  EXPECT_DOUBLE_EQ(dsa.f("full_attention_warmup_frac"), 512.0 / 46875.0);
  EXPECT_EQ(resolve_full_attention_warmup(dsa, tiny.steps).i("full_attention_warmup_steps"), 2);  // 1.75 rounded
  EXPECT_EQ(resolve_full_attention_warmup(dsa, 46875).i("full_attention_warmup_steps"), 512);
  // small keeps its 10 of 40 steps, as a fraction
  const TrainPreset small = train_preset("small");
  TrainOptions small_run;
  small_run.method = "seer";
  small_run.preset = "small";
  EXPECT_EQ(run_length(small_run, small).steps, 40);
  EXPECT_EQ(resolve_full_attention_warmup(Registry::get().method("seer").config.parse(small.config_for("seer")),
                                          run_length(small_run, small).steps)
                .i("full_attention_warmup_steps"),
            10);
  // a method without the knob is untouched
  const Config moba = Registry::get().method("moba").config.parse("");
  EXPECT_EQ(resolve_full_attention_warmup(moba, 3).str(), moba.str());
}

// The trainer applies the fraction to the run's steps and reports the steps it used; an explicit
// full_attention_warmup_steps overrides the fraction.
TEST(SparseWarmup, TrainerResolvesTheFractionAndTheOverride) {
  TrainResult r = run_train(dsa_run(",full_attention_warmup_frac=0.5", 4));
  EXPECT_EQ(r.cfg.i("full_attention_warmup_steps"), 2);
  EXPECT_EQ(r.steps_done, 4);
  r = run_train(dsa_run(",full_attention_warmup_frac=0.5,full_attention_warmup_steps=1", 4));
  EXPECT_EQ(r.cfg.i("full_attention_warmup_steps"), 1);
}

// A warm-up covering every step is refused (exit 2, the reason named) unless asked for explicitly.
TEST(SparseWarmup, FullWarmupIsRefusedUnlessAllowed) {
  for (const std::string& extra : {std::string(",full_attention_warmup_steps=512"), std::string(",full_attention_warmup_steps=3"),
                                   std::string(",full_attention_warmup_frac=1")}) {
    const std::string msg = usage_error(dsa_run(extra, 3));
    EXPECT_NE(msg.find("covers all 3 training steps"), std::string::npos) << extra << ": " << msg;
    EXPECT_NE(msg.find("allow_full_warmup=1"), std::string::npos) << msg;
  }
  testing::internal::CaptureStderr();
  const int rc = run_cli({"train", "--method", "dsa", "--config", kShape + ",full_attention_warmup_steps=512", "--steps", "2",
                          "--batch", "2", "--eval-batches", "1", "--probes", "0", "--quiet"});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("covers all 2 training steps"), std::string::npos) << err;

  TrainResult r = run_train(dsa_run(",full_attention_warmup_steps=512,allow_full_warmup=1", 2));
  EXPECT_EQ(r.cfg.i("full_attention_warmup_steps"), 512);
  EXPECT_EQ(r.steps_done, 2);
}

// A layer at a training step whose warm-up was never resolved says so rather than guessing.
TEST(SparseWarmup, UnresolvedWarmupAtATrainingStepIsAnError) {
  const MethodSpec& m = Registry::get().method("dsa");
  const Config cfg = m.config.parse(kShape);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(3));
  TensorMap in = m.make_inputs(cfg, LayerCtx{0, 2}, 1, 8, gen);
  for (const ParamDef& d : m.params(cfg, LayerCtx{0, 2}))
    in.set(d.name, at::randn(d.shape, gen, at::TensorOptions().dtype(at::kDouble)) * 0.1);
  EXPECT_NO_THROW(m.forward(in, cfg, LayerCtx{0, 2, -1}, Backend::CPU));
  EXPECT_THROW(m.forward(in, cfg, LayerCtx{0, 2, 0}, Backend::CPU), UsageError);
}
