// Tests of the training presets: every (preset, method) pair resolves to the same config and
// micro-batch as the presets have always given (a pinned table), the presets file is the one
// declared table of lineups and anchors, and no suite source names a method.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/source_dir.h"
#include "harness/args.h"
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
      {"dsa", "dsa_topk=32"},
      {"lt2_gdn", "lt2_loops=2"},
      {"lt2_hybrid_full_gdn", "lt2_loops=2"},
      {"lt2_hybrid_gdn_dsa", "lt2_loops=2,dsa_topk=32"},
      {"ouro", "n_loops=2"}}},
    {"small",
     {{"dsa", "full_attention_warmup_frac=0.25,dsa_topk=128"},
      {"qsa", "full_attention_warmup_frac=0.25"},
      {"seer", "full_attention_warmup_frac=0.25"},
      {"qsa_hybrid", "full_attention_warmup_frac=0.25"},
      {"lt2_gdn", "lt2_loops=2"},
      {"lt2_hybrid_full_gdn", "lt2_loops=2"},
      {"lt2_hybrid_gdn_dsa", "lt2_loops=2,full_attention_warmup_frac=0.25,dsa_topk=128"}}},
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
  // steps (as given or from the budget), batch, eval_every, eval_batches, checkpoint_every, probe_sequences,
  // cpu_threads, B_ref, bf16
  struct Budget {
    int64_t steps, batch, eval_every, eval_batches, ckpt, probes, threads;
    double ref;
    bool bf16;
  };
  for (const auto& [name, want] : std::map<std::string, Budget>{{"tiny", {160, 4, 40, 4, 50, 32, 1, 512.0, false}},
                                                                 {"small", {40, 32, 10, 4, 40, 128, 0, 16384.0, true}}}) {
    const TrainPreset p = train_preset(name);
    TrainOptions o;
    o.preset = name;
    const int64_t steps = run_length(o, p).steps;  // the preset's steps, or its budget's
    const std::vector<int64_t> got = {steps, p.batch, p.eval_every, p.eval_batches, p.checkpoint_every,
                                      p.probe_sequences, int64_t(p.cpu_threads)};
    EXPECT_EQ(got, (std::vector<int64_t>{want.steps, want.batch, want.eval_every, want.eval_batches, want.ckpt,
                                         want.probes, want.threads}))
        << name;
    EXPECT_EQ(p.hyper.batch_tokens_ref, want.ref) << name;
    EXPECT_EQ(p.hyper.muon_wd, 0.28) << name;
    EXPECT_EQ(p.hyper.muon_bf16, want.bf16) << name;
  }
  EXPECT_THROW(train_preset("huge"), UsageError);
}

TEST(TrainPresets, TheTableNamesRegisteredMethods) {
  const auto& table = train_presets_table();
  ASSERT_GE(table.size(), 2u);
  std::vector<std::string> names;
  for (const auto& [name, j] : table.items()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"tiny", "small", "small-rank", "gpu-d12"}));  // declaration order: the error message lists them so
  for (const auto& name : names) {
    const TrainPreset p = train_preset(name);
    EXPECT_EQ(p.name, name);
    EXPECT_TRUE(Registry::get().has_method(p.anchor)) << name;
    EXPECT_TRUE(Registry::get().has_method(p.baseline)) << name;
    for (const auto& m : p.lineup) EXPECT_TRUE(Registry::get().has_method(m)) << name << " " << m;
  }
  EXPECT_EQ(train_preset("tiny").lineup.size(), 6u);
  EXPECT_TRUE(train_preset("small").lineup.empty());  // "all": every registered method
  // gpu-d12: nanochat's d12 shape, 0.5M tokens per step in micro-batches, sparse read-backs
  const TrainPreset d12 = train_preset("gpu-d12");
  EXPECT_EQ(d12.config, "n_layer=12,d_model=768,head_dim=128,seq_len=2048,vocab=257");
  EXPECT_EQ(d12.batch * 2048, 524288);
  EXPECT_EQ(d12.micro_batch, 32);
  EXPECT_EQ(d12.log_every, 10);
  EXPECT_EQ(train_preset("tiny").micro_batch, 0);
  EXPECT_EQ(train_preset("tiny").log_every, 1);
  try {
    train_preset("huge");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("known: tiny, small, small-rank, gpu-d12"), std::string::npos) << e.what();
  }
}

// gpu-d12 (32 rows × 2048 tokens per micro-batch): the methods whose paths need fewer rows to fit
// an H200 say so, and the sparse ones warm up for a quarter of the run.
TEST(TrainPresets, GpuD12MicroBatchesArePinned) {
  const TrainPreset P = train_preset("gpu-d12");
  const std::map<std::string, int64_t> want = {{"gla", 8},  {"kda", 2},  {"kda_hybrid", 4}, {"deltanet", 16},
                                               {"deltanet_hybrid", 16}, {"dsa", 4}, {"moba", 2},
                                               {"moba_hybrid", 2}, {"nsa", 2}, {"qsa", 1}, {"qsa_hybrid", 1},
                                               {"seer", 1}};
  EXPECT_EQ(P.method_micro_batch, want);
  for (const char* m : {"dsa", "qsa", "seer", "qsa_hybrid"})
    EXPECT_NE(P.config_for(m).find("full_attention_warmup_frac=0.25"), std::string::npos) << m;
}

// A hybrid's preset config is its components' (qsa_hybrid: qsa's warm-up), its micro-batch its own.
TEST(TrainPresets, HybridsTakeTheirComponentsOverrides) {
  for (const auto* m : Registry::get().methods()) {
    if (!m->is_hybrid()) continue;
    std::set<std::string> comps;
    for (int64_t L : {4, 8}) {
      Config c = m->config.defaults().with("n_layer", L);
      for (const auto& ch : m->layout(c)) comps.insert(ch.method);
    }
    for (const auto& comp : comps)
      for (const auto& [preset, po] : Registry::get().method(comp).presets)
        for (const auto& item : split(po.config, ',')) {
          ASSERT_TRUE(m->presets.count(preset)) << m->name << " lacks " << comp << "'s " << preset;
          EXPECT_NE(("," + m->presets.at(preset).config + ",").find("," + item + ","), std::string::npos)
              << m->name << " " << preset << " " << item;
        }
  }
  EXPECT_EQ(Registry::get().method("qsa_hybrid").presets.at("small").micro_batch, 0);
}

// The suites know no method by name: every method-specific choice is declared where the method is
// registered, and the presets' lineups and anchors in suites/presets.json (the one table, checked
// above). No suite source holds a registered method's name as a string literal.
TEST(TrainPresets, NoSuiteSourceNamesAMethod) {
  const fs::path dir = fs::path(mixbench_test::source_dir()) / "suites";
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == "presets.json") continue;
    const std::string text = read_file(e.path().string());
    ++files;
    for (const auto* m : Registry::get().methods())
      EXPECT_EQ(text.find("\"" + m->name + "\""), std::string::npos)
          << e.path().filename().string() << " names method " << m->name;
  }
  EXPECT_GE(files, 4);
}

}  // namespace
