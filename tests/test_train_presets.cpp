// Tests of the training presets: every (preset, method) pair resolves to the same config and
// micro-batch as the presets have always given (a pinned table), the presets file is the one
// declared table of lineups and anchors, and no suite source names a method.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "suites/train.h"

namespace fs = std::filesystem;
using namespace mixbench;

namespace {

// Per-method overrides after the preset's backbone config, as pinned values (absent: none).
const std::map<std::string, std::map<std::string, std::string>> kPinnedConfig = {
    {"tiny",
     {{"moba", "moba_block=32,moba_topk=2"},
      {"moba_hybrid", "moba_block=32,moba_topk=2"},
      {"dsa", "dsa_topk=32,idx_heads=4,idx_dim=32,idx_rope_dim=16"}}},
    {"small",
     {{"dsa", "full_attention_warmup_steps=10,dsa_topk=128,idx_heads=4,idx_dim=64,idx_rope_dim=32"},
      {"qsa", "full_attention_warmup_steps=10"},
      {"seer", "full_attention_warmup_steps=10"},
      {"qsa_hybrid", "full_attention_warmup_steps=10"}}},
};
const std::map<std::string, std::map<std::string, int64_t>> kPinnedMicroBatch = {
    {"tiny", {}},
    {"small", {{"qsa", 8}, {"seer", 8}}},
};

TEST(TrainPresets, EveryMethodsConfigAndMicroBatchArePinned) {
  const std::map<std::string, std::string> backbone = {
      {"tiny", "n_layer=4,d_model=128,head_dim=32,seq_len=128,vocab=257"},
      {"small", "n_layer=6,d_model=384,head_dim=64,seq_len=512,vocab=257"}};
  for (const auto& [preset, base] : backbone) {
    const TrainPreset P = train_preset(preset);
    EXPECT_EQ(P.config, base);
    for (const auto* m : Registry::get().methods()) {
      const auto& pinned = kPinnedConfig.at(preset);
      auto it = pinned.find(m->name);
      const std::string want = it == pinned.end() ? base : base + "," + it->second;
      // the same config, field by field (the order of the overrides is free)
      EXPECT_EQ(m->config.parse(P.config_for(m->name)).str(), m->config.parse(want).str()) << preset << " " << m->name;
      const auto& mbs = kPinnedMicroBatch.at(preset);
      auto mb = mbs.find(m->name);
      auto got = P.method_micro_batch.find(m->name);
      if (mb == mbs.end()) EXPECT_TRUE(got == P.method_micro_batch.end()) << preset << " " << m->name;
      else if (got == P.method_micro_batch.end()) ADD_FAILURE() << preset << " " << m->name << " lost its micro-batch";
      else EXPECT_EQ(got->second, mb->second) << preset << " " << m->name;
    }
    for (const auto& [m, mb] : P.method_micro_batch) EXPECT_TRUE(Registry::get().has_method(m)) << m;
  }
  const TrainPreset t = train_preset("tiny");
  EXPECT_EQ(t.steps, 160);
  EXPECT_EQ(t.batch, 4);
  EXPECT_EQ(t.eval_every, 40);
  EXPECT_EQ(t.eval_batches, 4);
  EXPECT_EQ(t.checkpoint_every, 50);
  EXPECT_EQ(t.probe_sequences, 32);
  EXPECT_EQ(t.cpu_threads, 1);
  EXPECT_EQ(t.hyper.batch_tokens_ref, 512.0);
  EXPECT_EQ(t.hyper.muon_wd, 0.28);
  EXPECT_FALSE(t.hyper.muon_bf16);
  const TrainPreset s = train_preset("small");
  EXPECT_EQ(s.steps, 40);
  EXPECT_EQ(s.batch, 32);
  EXPECT_EQ(s.eval_every, 10);
  EXPECT_EQ(s.eval_batches, 4);
  EXPECT_EQ(s.checkpoint_every, 40);
  EXPECT_EQ(s.probe_sequences, 128);
  EXPECT_EQ(s.cpu_threads, 0);
  EXPECT_EQ(s.hyper.batch_tokens_ref, 16384.0);
  EXPECT_EQ(s.hyper.muon_wd, 0.28);
  EXPECT_TRUE(s.hyper.muon_bf16);
  EXPECT_THROW(train_preset("huge"), UsageError);
}

}  // namespace
