// Tests of budgets and real text: Kendall's τ-b on hand-made rankings, the budget-independent
// schedule variant, budgets → steps at a preset's anchor, runs branched off a longer budget's run
// (bitwise the standalone runs), the leaderboard's per-budget rankings, the corpus builder
// (ci/text_corpus.py) on a hand-made input and `--data text` on its output.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "tests/source_dir.h"
#include "tests/test_util.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "suites/rank_agreement.h"
#include "suites/train.h"
#include "suites/train_data.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {
using mixbench_test::EnvGuard;

fs::path budget_tmp() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / fmt::format("mixbench_budget_test_{}", ::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string tokens_text(const at::Tensor& t) {  // byte tokens as text, BOS as '|'
  std::string s;
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.size(0); ++i) s += p[i] == kByteBos ? '|' : char(p[i]);
  return s;
}

// A CPU-sized run of dense at a preset on `data`.
TrainOptions cpu_run(const std::string& preset, const std::string& data, const std::string& config, int64_t batch) {
  TrainOptions o;
  o.method = "dense";
  o.preset = preset;
  o.data = data;
  o.config = config;
  o.batch = batch;
  o.eval_batches = 1;
  return o;
}


}  // namespace

// ------------------------------------------------------------------ Kendall τ-b
TEST(RankAgreement, KendallTauOnHandMadeRankings) {
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4}, {1, 2, 3, 4}), 1.0);
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);  // only the order counts
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4, 5}, {5, 4, 3, 2, 1}), -1.0);
  // 6 concordant, 4 discordant of 10 pairs
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4, 5}, {3, 4, 1, 2, 5}), 0.2);
  // ties: 4 concordant, one pair tied in each: τ-b = 4 / √(5·5) (τ-a would be 4/6)
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 2, 3}, {1, 2, 3, 3}), 0.8);
  EXPECT_DOUBLE_EQ(kendall_tau({1, 1, 2, 2}, {1, 2, 1, 2}), 0.0);
  EXPECT_TRUE(std::isnan(kendall_tau({1}, {1})));
  EXPECT_TRUE(std::isnan(kendall_tau({}, {})));
  EXPECT_TRUE(std::isnan(kendall_tau({2, 2, 2}, {1, 2, 3})));
  EXPECT_THROW(kendall_tau({1, 2}, {1, 2, 3}), UsageError);
}

// ------------------------------------------------------------------ the schedule variant
TEST(Budgets, WarmdownWeightDecayIsBudgetIndependentBeforeTheWarmdown) {
  Schedule a, b;
  a.warmup = 2;
  a.steps = 20;
  a.wd_follows_lr = true;
  b = a;
  b.steps = 40;
  // warmdown of 20 steps: round(0.65·20) = 13 → starts after iteration 7
  for (int64_t it = 0; it <= 7; ++it) EXPECT_EQ(muon_weight_decay(a, it, 0.28), 0.28) << it;
  for (int64_t it = 8; it < 20; ++it) EXPECT_DOUBLE_EQ(muon_weight_decay(a, it, 0.28), 0.28 * lr_multiplier(a, it));
  EXPECT_LT(muon_weight_decay(a, 19, 0.28), 0.28 * 0.2);
  EXPECT_EQ(first_schedule_difference(a, b, 0.28), 8);
  // nanochat's cosine depends on the horizon from the second iteration on
  a.wd_follows_lr = b.wd_follows_lr = false;
  EXPECT_EQ(first_schedule_difference(a, b, 0.28), 1);
  EXPECT_EQ(first_schedule_difference(a, a, 0.28), 20);
}

// ------------------------------------------------------------------ budgets → steps
TEST(Budgets, ParseAndPlanAtTheAnchor) {
  EXPECT_EQ(parse_budget("tpp=20").kind, Budget::Kind::TokensPerParam);
  EXPECT_EQ(parse_budget("flops=1e17").value, 1e17);
  EXPECT_EQ(parse_budget("steps=12").str(), "steps=12");
  EXPECT_EQ(parse_budget("tpp=0.5").str(), "tpp=0.5");
  EXPECT_EQ(parse_budget("flops=1.2345678901234e17").str(), "flops=1.2345678901234e+17");  // exact: runs re-read it
  for (const char* bad : {"tpp=", "tpp", "x=3", "tpp=-1", "tpp=0", "flops=1e17x", "steps=1.5", "tpp=nan"})
    EXPECT_THROW(parse_budget(bad), UsageError) << bad;

  const TrainPreset P = train_preset("tiny");
  const MethodSpec& dense = Registry::get().method(P.anchor);
  const Config cfg = dense.config.parse(P.config_for(dense.name) + ",seq_len=64");
  CostQuery q;
  q.T = 64;
  const ModelCost cost = account_model(dense, cfg, q);
  const int64_t horizon_params = cost.params.transformer_matrices + cost.params.lm_head;
  const BudgetPlan t = plan_budget(parse_budget("tpp=2"), P, 4, "seq_len=64");
  EXPECT_EQ(t.anchor, "dense");
  EXPECT_EQ(t.anchor_params, horizon_params);
  EXPECT_EQ(t.steps, std::llround(2.0 * double(horizon_params) / (4 * 64)));
  EXPECT_EQ(t.tokens, t.steps * 4 * 64);
  const BudgetPlan f = plan_budget(parse_budget("flops=1e12"), P, 4, "seq_len=64");
  EXPECT_EQ(f.anchor_flops_per_token, cost.train_flops_nanochat);
  EXPECT_EQ(f.steps, std::llround(1e12 / cost.train_flops_nanochat / (4 * 64)));
  EXPECT_EQ(plan_budget(parse_budget("flops=1"), P, 4, "").steps, 1);  // at least one step
  // another method's own knobs are not the anchor's
  EXPECT_EQ(plan_budget(parse_budget("tpp=2"), P, 4, "dsa_topk=8,seq_len=64").steps, t.steps);

  // --steps wins over --budget, which wins over the preset's budget or steps
  TrainOptions o;
  o.preset = "tiny";
  EXPECT_EQ(run_length(o, P).steps, P.steps);
  o.budget = "steps=9";
  EXPECT_EQ(run_length(o, P).steps, 9);
  o.steps = 5;
  EXPECT_EQ(run_length(o, P).steps, 5);
  const TrainPreset S = train_preset("small");
  TrainOptions s;
  s.preset = "small";
  EXPECT_EQ(run_length(s, S).budget.kind, Budget::Kind::TokensPerParam);
  EXPECT_EQ(run_length(s, S).steps, 40);  // the preset's length before it stated a budget
  // small-rank: the same shape at the budget whose ranking held at twice it
  const TrainPreset R = train_preset("small-rank");
  TrainOptions r;
  r.preset = "small-rank";
  EXPECT_EQ(run_length(r, R).steps, 600);
  EXPECT_EQ(R.config, S.config);
  EXPECT_TRUE(R.is_default);
  EXPECT_GE(R.tau_2x, kMinDefaultTau);
}

TEST(Budgets, PresetFieldsAndTheDefaultRule) {
  const TrainPreset tiny = train_preset("tiny"), small = train_preset("small");
  EXPECT_EQ(tiny.data, "synthetic");
  EXPECT_FALSE(tiny.hyper.schedule.wd_follows_lr);  // nanochat's cosine, as before
  EXPECT_FALSE(tiny.budget.has_value());
  EXPECT_EQ(small.data, "text");
  EXPECT_TRUE(small.hyper.schedule.wd_follows_lr);
  ASSERT_TRUE(small.budget.has_value());
  for (const auto& [name, j] : train_presets_table().items()) {
    const TrainPreset p = train_preset(name);
    if (p.is_default) EXPECT_FALSE(p.tau_2x < kMinDefaultTau) << name;
  }
  nlohmann::ordered_json j = train_presets_table().at("small");
  EXPECT_FALSE(small.is_default);  // its 2x check passed, its ranking at 600 steps did not agree (tau_note)
  j["default"] = true;
  j["tau_2x"] = 0.5;
  EXPECT_THROW(train_preset_from_json("x", j), std::logic_error);  // a default with disagreeing rankings
  j["default"] = false;
  EXPECT_EQ(train_preset_from_json("x", j).tau_2x, 0.5);
  j["tau_2x"] = 0.9;
  j["default"] = true;
  EXPECT_TRUE(train_preset_from_json("x", j).is_default);
  j.erase("budget");
  EXPECT_THROW(train_preset_from_json("x", j), std::logic_error);  // neither budget nor steps
  j["budget"] = {{"tokens", 3}};
  EXPECT_THROW(train_preset_from_json("x", j), std::logic_error);
}

// train --budget: the steps follow from the budget at the anchor and train.json records it; --steps wins.
TEST(Budgets, TrainCommandRecordsItsBudget) {
  const fs::path dir = budget_tmp() / "train_budget";
  const std::vector<std::string> base = {"train", "--method", "gdn", "--config", "n_layer=1,d_model=64,head_dim=32,seq_len=16",
                                         "--batch", "1", "--probes", "0", "--eval-batches", "1", "--quiet", "--out",
                                         dir.string()};
  const BudgetPlan plan = plan_budget(parse_budget("flops=6e7"), train_preset("tiny"), 1,
                                      "n_layer=1,d_model=64,head_dim=32,seq_len=16");
  ASSERT_GT(plan.steps, 1);
  ASSERT_LT(plan.steps, 20);
  auto args = base;
  args.insert(args.end(), {"--budget", "flops=6e7"});
  ASSERT_EQ(run_cli(args), 0);
  Json r = Json::parse(read_file((dir / "train.json").string()));
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  const Json& row = r["results"][0];
  EXPECT_EQ(row["budget"]["budget"], "flops=60000000");
  EXPECT_EQ(row["budget"]["anchor"], "dense");  // gdn trains on the tokens dense's FLOPs give
  EXPECT_EQ(row["steps"], plan.steps);
  EXPECT_EQ(row["tokens"], plan.tokens);
  EXPECT_EQ(r["config"]["budget"]["steps"], plan.steps);
  args.insert(args.end(), {"--steps", "2"});
  ASSERT_EQ(run_cli(args), 0);
  r = Json::parse(read_file((dir / "train.json").string()));
  EXPECT_EQ(r["results"][0]["steps"], 2);
  EXPECT_EQ(r["results"][0]["budget"]["budget"], "steps=2");
  args = base;
  args.insert(args.end(), {"--budget", "flops"});
  EXPECT_EQ(run_cli(args), 2);
}

// ------------------------------------------------------------------ branched runs
// The small preset's schedule (weight decay with the LR in the warmdown) at a CPU-sized model: the
// 6-step run branches off the 10-step run at its warmdown, and both equal their standalone runs
// bit for bit.
TEST(Budgets, BranchedRunsEqualStandaloneRunsBitwise) {
  TrainOptions o = cpu_run("small", "synthetic", "n_layer=2,d_model=64,head_dim=32,seq_len=32", 2);
  o.seed = 3;
  o.eval_every = 2;
  o.probe_sequences = 2;
  const std::vector<Budget> budgets = {parse_budget("steps=10"), parse_budget("steps=6")};
  // another way of saying 10 steps: the same run, under its own budget
  const BudgetPlan ten = plan_budget(parse_budget("steps=10"), train_preset("small"), 2, o.config);
  const Budget same = parse_budget(fmt::format("flops={:.17g}", double(ten.tokens) * ten.anchor_flops_per_token));
  Schedule a = train_preset("small").hyper.schedule, b = a;
  a.steps = 6;
  b.steps = 10;
  ASSERT_EQ(first_schedule_difference(a, b, 0.28), 3);  // a real branch: 3 shared steps
  std::vector<Budget> with_same = budgets;
  with_same.push_back(same);
  const std::vector<TrainResult> branched = run_budgets(o, with_same);
  ASSERT_EQ(branched.size(), 3u);
  EXPECT_EQ(branched[2].losses, branched[0].losses);
  EXPECT_EQ(branched[2].budget.budget.kind, Budget::Kind::Flops);
  EXPECT_EQ(branched[2].budget.steps, 10);
  for (size_t k = 0; k < 2; ++k) {
    TrainOptions alone = o;
    alone.budget = budgets[k].str();
    const TrainResult s = run_train(alone);
    const TrainResult& r = branched[k];
    EXPECT_EQ(r.steps_done, s.steps_done);
    EXPECT_EQ(r.losses, s.losses) << budgets[k].str();
    ASSERT_EQ(r.val_curve.size(), s.val_curve.size());
    for (size_t i = 0; i < s.val_curve.size(); ++i) {
      EXPECT_EQ(r.val_curve[i].first, s.val_curve[i].first);
      EXPECT_EQ(r.val_curve[i].second, s.val_curve[i].second);
    }
    EXPECT_EQ(r.val_bpb, s.val_bpb);
    EXPECT_EQ(r.probes, s.probes);
    EXPECT_EQ(r.budget.steps, s.steps_done);
  }
  EXPECT_EQ(branched[0].steps_done, 10);
  EXPECT_EQ(branched[1].steps_done, 6);
  EXPECT_EQ(branched[0].losses[2], branched[1].losses[2]);
  // The runs differ after the branch. Within the LR warmup only Muon's weight decay differs there,
  // too little to move a printed loss: compare the parameters after the shared steps and after 5.
  auto params_after = [&](const Budget& b, int64_t steps) {
    TrainOptions run = o;
    run.budget = b.str();
    run.probe_sequences = 0;
    RunSnapshot snap;
    run.snapshot_at = steps;
    run.snapshot_out = &snap;
    run_train(run);
    return snap.tensors;
  };
  auto differing = [](const TensorMap& x, const TensorMap& y) {
    int n = 0;
    for (const auto& name : x.names())
      if (name.rfind("param.", 0) == 0 && !at::equal(x.at(name), y.at(name))) ++n;
    return n;
  };
  EXPECT_EQ(differing(params_after(budgets[0], 3), params_after(budgets[1], 3)), 0);
  EXPECT_GT(differing(params_after(budgets[0], 5), params_after(budgets[1], 5)), 0);
}

TEST(Budgets, LeaderboardRanksEachBudgetWithKendallTau) {
  fs::path out = budget_tmp() / "lb.json";
  ASSERT_EQ(run_cli({"leaderboard", "--methods", "dense_full,mqa", "--config", "seq_len=32", "--budgets",
                     "steps=2,steps=3", "--batch", "1", "--probes", "0", "--out", out.string(), "--quiet"}),
            0);
  Json r = Json::parse(read_file(out.string()));
  auto errs = validate_json(r, report_schema());
  EXPECT_TRUE(errs.empty()) << (errs.empty() ? "" : errs[0]);
  ASSERT_EQ(r["results"].size(), 4u);  // two methods at two budgets
  for (const auto& x : r["results"]) {
    EXPECT_EQ(x["status"], "ok");
    EXPECT_EQ(x["steps"], x["budget"]["steps"]);
    EXPECT_EQ(x["tokens"], x["budget"]["tokens"]);
  }
  ASSERT_EQ(r["budgets"].size(), 2u);
  EXPECT_EQ(r["budgets"][0]["budget"], "steps=2");
  EXPECT_EQ(r["budgets"][1]["steps"], 3);
  EXPECT_EQ(r["budgets"][1]["ranking"].size(), 2u);
  ASSERT_EQ(r["kendall_tau"].size(), 1u);
  const double tau = r["kendall_tau"][0]["tau"].get<double>();
  EXPECT_TRUE(tau == 1.0 || tau == -1.0);  // two methods: the same order or the reverse
  EXPECT_EQ(tau, r["budgets"][0]["ranking"] == r["budgets"][1]["ranking"] ? 1.0 : -1.0);
  const std::string md = read_file(fs::path(out).replace_extension(".md").string());
  EXPECT_NE(md.find("## budget steps=3 (3 steps, 96 tokens)"), std::string::npos);
  EXPECT_NE(md.find("| steps=2 vs steps=3 |"), std::string::npos);
  EXPECT_EQ(run_cli({"leaderboard", "--budgets", "tpp=x"}), 2);
  EXPECT_EQ(run_cli({"leaderboard", "--budget", "tpp=1", "--budgets", "tpp=1,tpp=2"}), 2);
}

// A leaderboard over two budgets interrupted after one cell continues from its report: the kept
// cell is not trained again, and every budget's numbers equal those of an uninterrupted run.
TEST(Budgets, LeaderboardWithBudgetsResumes) {
  const fs::path part = budget_tmp() / "lb_part.json", whole = budget_tmp() / "lb_whole.json";
  const std::vector<std::string> base = {"leaderboard", "--methods", "dense_full,mqa", "--config", "seq_len=32",
                                         "--budgets", "steps=2,steps=3", "--batch", "1", "--probes", "0", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run_cli(with({"--out", part.string(), "--stop-after", "1"})), 0);
  Json r = Json::parse(read_file(part.string()));
  EXPECT_EQ(r["summary"]["cells_done"], 1);
  ASSERT_EQ(run_cli(with({"--out", part.string()})), 0);
  const Json resumed = Json::parse(read_file(part.string()));
  EXPECT_TRUE(resumed["summary"]["complete"].get<bool>());
  EXPECT_EQ(resumed["summary"]["cells_trained"], 1) << "only the missing cell trained";
  ASSERT_EQ(run_cli(with({"--out", whole.string()})), 0);
  const Json straight = Json::parse(read_file(whole.string()));
  ASSERT_EQ(resumed["results"].size(), 4u);
  ASSERT_EQ(straight["results"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed["results"][i]["method"], straight["results"][i]["method"]);
    EXPECT_EQ(resumed["results"][i]["budget"], straight["results"][i]["budget"]);
    const std::string key = straight["results"][i].contains("val_bits_per_token") ? "val_bits_per_token" : "val_bpb";
    ASSERT_TRUE(straight["results"][i][key].is_number()) << i;
    EXPECT_EQ(resumed["results"][i][key], straight["results"][i][key]) << i;
  }
  EXPECT_EQ(resumed["kendall_tau"], straight["kendall_tau"]);
}

// ------------------------------------------------------------------ the real-text corpus
// ci/text_corpus.py on hand-made packages: HTML to text, whitespace normalised, duplicates dropped,
// every 100th kept document to validation; then `--data text` reads the folder it wrote.
// The run's val_bpb: by default (tiny) the curve's last evaluation; with final_eval_batches −1 the
// whole validation stream in non-overlapping rows, N: N batches; the curve is the same either way.
TEST(Budgets, FinalEvaluationCoversTheValidationStreamItIsAskedTo) {
  TrainOptions o = cpu_run("tiny", "synthetic", "n_layer=1,d_model=64,head_dim=32,seq_len=16", 8);
  o.steps = 2;
  o.probe_sequences = 0;
  const int64_t B = 8, T = 16;
  const TrainResult curve = run_train(o);
  ASSERT_FALSE(curve.val_curve.empty());
  EXPECT_EQ(curve.val_bpb, curve.val_curve.back().second);
  EXPECT_GT(curve.val_tokens, 0);
  EXPECT_LE(curve.val_tokens, B * T);  // eval_batches = 1
  // the targets that are not BOS in the first n rows' worth of the validation stream
  const Corpus c = load_corpus("synthetic", o.seed, T, o.steps * B * (T + 1));
  auto scored = [&](int64_t n) {
    int64_t k = 0;
    for (int64_t b = 0; b < n; ++b) {
      at::Tensor x, y;
      get_batch(c.val, b * B * (T + 1), B, T, x, y);
      k += (y != c.bos).sum().item<int64_t>();
    }
    return k;
  };
  EXPECT_EQ(curve.val_tokens, scored(1));
  o.final_eval_batches = -1;
  const TrainResult all = run_train(o);
  const int64_t n_all = c.val.size(0) / (B * (T + 1));
  ASSERT_GT(n_all, 10);
  EXPECT_EQ(all.val_tokens, scored(n_all));
  EXPECT_EQ(all.val_curve, curve.val_curve);  // the same training and curve
  EXPECT_NE(all.val_bpb, curve.val_bpb);
  EXPECT_TRUE(std::isfinite(all.val_bpb));
  o.final_eval_batches = 3;
  const TrainResult three = run_train(o);
  EXPECT_EQ(three.val_tokens, scored(3));
  // the report carries the count
  EXPECT_EQ(train_result_json(all)["val_tokens"].get<int64_t>(), all.val_tokens);
}

TEST(TextCorpus, BuilderCleansDeduplicatesSplitsAndTrainReadsIt) {
  const fs::path root = budget_tmp() / "pkgs", out = budget_tmp() / "text";
  fs::remove_all(root);
  fs::remove_all(out);
  write_text(root / "sources.json",
             R"([{"package": "alpha", "version": "1", "deb": "alpha_1_all.deb", "sha256": "00", "licence": "MIT"},
                 {"package": "beta", "version": "2", "deb": "beta_2_all.deb", "sha256": "11", "licence": "MIT"}])");
  write_text(root / "alpha/usr/share/doc/alpha/a.html",
             "<html><head><style>p {}</style><script>var x;</script><title>T</title></head>"
             "<body><p>Fish &amp;\n   chips</p><pre>  x = 1\n  y</pre></body></html>");
  write_text(root / "alpha/usr/share/doc/alpha/b.txt", "line one   \r\nline\ttwo\r\n\r\n\r\n\r\nend\x01\n\n");
  write_text(root / "alpha/usr/share/doc/alpha/c.txt", "line one\nline    two\n\nend");  // b.txt once cleaned
  write_text(root / "alpha/usr/share/doc/alpha/copyright", "not a document");
  write_text(root / "alpha/usr/share/doc/alpha/d.png", "not text");
  write_text(root / "alpha/usr/share/doc/alpha/e.txt", "\n\n  \n");  // empty once cleaned
  // not English: a translated file (not selected) and a document over 5 % non-ASCII (dropped); a
  // few accented letters in English text are kept
  write_text(root / "alpha/usr/share/doc/alpha/translations/ja_JP/f.txt", "an English line under translations/");
  write_text(root / "alpha/usr/share/doc/alpha/g.txt", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 with some English words");
  write_text(root / "alpha/usr/share/doc/alpha/h.txt", "a na\u00efve caf\u00e9 in a sentence long enough to stay English");
  for (int i = 0; i < 120; ++i) write_text(root / fmt::format("beta/doc/{:03d}.txt", i), fmt::format("doc {} of beta, long enough for a row\n", i));
  const std::string cmd = fmt::format("python3 '{}/ci/text_corpus.py' '{}' '{}' > /dev/null", mixbench_test::source_dir(),
                                      root.string(), out.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  // kept documents: a.html, b.txt, h.txt, beta 000..119 (c.txt a duplicate, e.txt empty, g.txt not
  // English, translations/ not selected) = 123; the 100th (beta 096) is the validation's
  const Corpus c = builtin_text_corpus(out.string());
  std::string expect_train =
      "|T\n\nFish & chips\n\n  x = 1\n  y|line one\nline    two\n\nend|a na\u00efve caf\u00e9 in a sentence long enough to stay English",
              expect_val;
  for (int i = 0; i < 120; ++i)
    (i == 96 ? expect_val : expect_train) += fmt::format("|doc {} of beta, long enough for a row", i);
  EXPECT_EQ(tokens_text(c.train), expect_train);
  EXPECT_EQ(tokens_text(c.val), expect_val);
  EXPECT_TRUE(c.byte_level);
  const Json m = Json::parse(read_file((out / "manifest.json").string()));
  EXPECT_EQ(m["documents"], 123);
  EXPECT_EQ(m["files"]["val.bin"]["documents"], 1);
  EXPECT_EQ(m["sources"][0]["duplicates"], 1);
  EXPECT_EQ(m["sources"][0]["non_english"], 1);
  EXPECT_EQ(m["sources"][0]["documents"], 3);
  EXPECT_EQ(m["sources"][1]["documents"], 120);
  EXPECT_NE(m["split"].get<std::string>().find("% 100 == 0"), std::string::npos);

  // --data text: found through MIXBENCH_DATA_DIR (the folder itself, or a folder holding text/)
  TrainOptions o = cpu_run("tiny", "text", "n_layer=1,d_model=64,head_dim=32,seq_len=16", 1);
  o.steps = 2;
  o.probe_sequences = 0;
  {
    EnvGuard env("MIXBENCH_DATA_DIR", budget_tmp().string());
    EXPECT_EQ(builtin_text_dir(), out.string());
    const TrainResult r = run_train(o);
    EXPECT_EQ(r.steps_done, 2);
    EXPECT_TRUE(std::isfinite(r.val_bpb));
    EXPECT_GT(r.val_bpb, 0.0);
  }
  {
    EnvGuard env("MIXBENCH_DATA_DIR", out.string());
    EXPECT_EQ(builtin_text_dir(), out.string());
  }
  // a missing corpus: an InputError that says how to get it, exit code 2 from the command
  EnvGuard env("MIXBENCH_DATA_DIR", (budget_tmp() / "nowhere").string());
  try {
    run_train(o);
    ADD_FAILURE() << "no error for a missing corpus";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ci/fetch_text.sh"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
  EXPECT_EQ(run_cli({"train", "--method", "dense", "--data", "text", "--steps", "1", "--quiet"}), 2);
}
