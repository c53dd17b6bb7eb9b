// Tests of the synthetic task suite: every generator solved by a hand-written oracle that reads only
// the tokens before each answer; constant and random predictors at chance; determinism, disjoint
// train / held-out streams, longer length-generalisation instances; the masked loss; the report's
// schema, pages and command line; and the cpu-tiny preset end to end.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <unistd.h>

#include "harness/backbone.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "reports/tasks.h"
#include "suites/tasks.h"
#include "suites/tasks_data.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

fs::path tasks_tmp() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / fmt::format("mixbench_tasks_test_{}", ::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

// The settings the generator tests use: small, with every task.
std::vector<TaskSetting> small_settings() {
  return {
      {"mqar", 64, 8, 64, 128, {64}},
      {"in_context_recall", 64, 0, 64, 0, {64}},
      {"noisy_recall", 64, 0, 64, 0, {64}},
      {"fuzzy_recall", 64, 0, 64, 0, {64}},
      {"selective_copy", 64, 0, 64, 0, {64}},
      {"compression", 31, 0, 64, 0, {31}},
      {"memorization", 32, 0, 64, 0, {32}},
      {"s3", 6, 0, 64, 0, {6, 12, 24}},
      {"s5", 6, 0, 64, 0, {6, 12, 24}},
      {"parity", 8, 0, 64, 0, {8, 16, 32}},
  };
}

// A next-token rule that sees only the tokens before the position it predicts (-1: no guess).
using Predict = std::function<int64_t(const std::vector<int64_t>& prefix)>;

// Logits [B, L, V] putting all mass on `f`'s guess at every column, from the row's tokens before it.
LogitsFn logits_of(const Predict& f, int64_t vocab) {
  return [=](const at::Tensor& idx) {
    const int64_t B = idx.size(0), L = idx.size(1);
    at::Tensor lg = at::zeros({B, L, vocab});
    auto a = idx.accessor<int64_t, 2>();
    auto g = lg.accessor<float, 3>();
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> prefix;  // the row's tokens after BOS, up to column t
      for (int64_t t = 0; t < L; ++t) {
        if (t > 0) prefix.push_back(a[b][t]);
        const int64_t p = f(prefix);
        if (p >= 0 && p < vocab) g[b][t][p] = 1.0f;
      }
    }
    return lg;
  };
}

// Lexicographic rank of a permutation of {0..n−1} (its Lehmer code) and its inverse: the
// generator's ranking, computed here independently of it.
int64_t perm_rank(const std::vector<int>& p) {
  int64_t r = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    int64_t smaller = 0;
    for (size_t j = i + 1; j < p.size(); ++j) smaller += p[j] < p[i];
    r = r * int64_t(p.size() - i) + smaller;
  }
  return r;
}
std::vector<int> perm_unrank(int n, int64_t r) {
  std::vector<int64_t> digits(static_cast<size_t>(n));
  for (int i = n - 1, base = 1; i >= 0; --i, ++base) {
    digits[size_t(i)] = r % base;
    r /= base;
  }
  std::vector<int> left(static_cast<size_t>(n)), p;
  std::iota(left.begin(), left.end(), 0);
  for (int i = 0; i < n; ++i) {
    p.push_back(left[size_t(digits[size_t(i)])]);
    left.erase(left.begin() + digits[size_t(i)]);
  }
  return p;
}

// The oracle of each task: solves it from the tokens (memorization: from the training stream's map).
Predict oracle(const TaskSetting& s) {
  const int64_t V = task_vocab(s);
  const std::string& t = s.task;
  if (t == "mqar" || t == "in_context_recall" || t == "noisy_recall")
    return [](const std::vector<int64_t>& x) -> int64_t {  // the token after the key's first occurrence
      if (x.empty()) return -1;
      for (size_t i = 0; i + 1 < x.size(); ++i)
        if (x[i] == x.back()) return x[i + 1];
      return -1;
    };
  if (t == "fuzzy_recall") {
    const int64_t K = (V - 2) / 2, ns = V - 2;
    return [=](const std::vector<int64_t>& x) -> int64_t {
      auto is_key = [&](int64_t v) { return v >= 0 && v < K; };
      auto is_val = [&](int64_t v) { return v >= K && v < ns; };
      int64_t e = int64_t(x.size());
      int64_t j = 0;  // value tokens already given
      while (e > 0 && is_val(x[size_t(e - 1)])) --e, ++j;
      int64_t b = e;
      while (b > 0 && is_key(x[size_t(b - 1)])) --b;
      if (e - b != 3) return -1;  // held-out keys are 3-token motifs
      for (int64_t i = 0; i + 3 < b; ++i) {
        if ((i > 0 && is_key(x[size_t(i - 1)])) || !std::equal(x.begin() + i, x.begin() + i + 3, x.begin() + b)) continue;
        if (i + 3 + j < b && is_val(x[size_t(i + 3 + j)]) && is_val(x[size_t(i + 3)])) return x[size_t(i + 3 + j)];
      }
      return -1;
    };
  }
  if (t == "selective_copy")
    return [=](const std::vector<int64_t>& x) -> int64_t {
      auto c = std::find(x.begin(), x.end(), V - 1);
      if (c == x.end()) return -1;
      std::vector<int64_t> items;
      for (auto it = x.begin(); it != c; ++it)
        if (*it != V - 2) items.push_back(*it);
      const size_t k = size_t(x.end() - c - 1);
      return k < items.size() ? items[k] : -1;
    };
  if (t == "compression") {
    const int64_t content = 15;  // the default vocabulary 16: content tokens 0..14, marker 15
    return [=](const std::vector<int64_t>& x) -> int64_t {
      if (x.empty() || x.back() <= content) return -1;
      const size_t i = size_t(x.back() - content - 1);
      return i < x.size() ? x[i] : -1;
    };
  }
  if (t == "memorization") {
    auto map = std::make_shared<std::map<int64_t, int64_t>>();
    for (int64_t i = 0; i < 400; ++i) {
      const ProbeSeq q = task_instance(s, 7, TaskSplit::Train, i, s.length);
      for (size_t k = 0; k + 1 < q.tokens.size(); k += 2) (*map)[q.tokens[k]] = q.tokens[k + 1];
    }
    return [map](const std::vector<int64_t>& x) -> int64_t {
      if (x.empty()) return -1;
      auto it = map->find(x.back());
      return it == map->end() ? -1 : it->second;
    };
  }
  if (t == "s3" || t == "s5") {
    const int n = t == "s3" ? 3 : 5;
    const int64_t order = t == "s3" ? 6 : 120;
    return [=](const std::vector<int64_t>& x) -> int64_t {
      if (x.size() < 4 || (x.size() - 4) % 2 != 0) return -1;  // "sN:" then g p pairs, then g
      std::vector<int> p(static_cast<size_t>(n));
      std::iota(p.begin(), p.end(), 0);
      for (size_t i = 3; i < x.size(); i += 2) {
        if (x[i] < 128 || x[i] >= 128 + order) return -1;
        const std::vector<int> g = perm_unrank(n, x[i] - 128);
        std::vector<int> q(static_cast<size_t>(n));
        for (int k = 0; k < n; ++k) q[size_t(k)] = p[size_t(g[size_t(k)])];
        p = q;
      }
      return 128 + perm_rank(p);
    };
  }
  return [](const std::vector<int64_t>& x) -> int64_t {  // parity of the bits at even positions
    if (x.size() % 2 != 1) return -1;
    int64_t par = 0;
    for (size_t i = 0; i < x.size(); i += 2) par ^= x[i];
    return 2 + par;
  };
}

std::vector<ProbeSeq> held_out(const TaskSetting& s, int64_t n, int64_t length, uint64_t seed = 3) {
  std::vector<ProbeSeq> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(task_instance(s, seed, TaskSplit::HeldOut, i, length));
  return v;
}

}  // namespace

TEST(TaskData, OracleSolvesEveryTaskOnHeldOutInstances) {
  for (const auto& s : small_settings()) {
    SCOPED_TRACE(s.label());
    check_task_setting(s);
    const int64_t V = task_vocab(s) + 1;
    for (int64_t L : s.test_lengths) {
      const auto seqs = held_out(s, 48, L);
      for (const auto& q : seqs) ASSERT_FALSE(q.answer_pos.empty());
      const ProbeScore sc = score_probes(seqs, logits_of(oracle(s), V), task_vocab(s));
      EXPECT_EQ(sc.accuracy, 1.0) << "length " << L;
      EXPECT_EQ(sc.exact, 1.0);
      EXPECT_GT(sc.answers, 48);
    }
  }
}

TEST(TaskData, ConstantAndRandomPredictorsScoreChance) {
  for (const auto& s : small_settings()) {
    SCOPED_TRACE(s.label());
    const auto alphabet = task_answer_alphabet(s);
    const double chance = task_chance(s);
    ASSERT_DOUBLE_EQ(chance, 1.0 / double(alphabet.size()));
    const int64_t n = 400;
    const auto seqs = held_out(s, n, s.length, 11);
    // answers within an instance may be dependent: the tolerance counts instances, not answers
    const double tol = 4.5 * std::sqrt(chance * (1 - chance) / double(n));
    const int64_t V = task_vocab(s) + 1;
    const ProbeScore constant = score_probes(seqs, logits_of([&](const auto&) { return alphabet[0]; }, V), V - 1);
    EXPECT_NEAR(constant.accuracy, chance, tol);
    auto rng = std::make_shared<std::mt19937_64>(5);
    const ProbeScore random = score_probes(
        seqs, logits_of([=](const auto&) { return alphabet[size_t((*rng)() % alphabet.size())]; }, V), V - 1);
    EXPECT_NEAR(random.accuracy, chance, tol);
    // a model that has learned nothing (uniform random logits over the whole vocabulary) is at chance or below
    at::manual_seed(1);
    const ProbeScore noise = score_probes(seqs, [&](const at::Tensor& idx) { return at::randn({idx.size(0), idx.size(1), V}); },
                                          V - 1);
    EXPECT_LT(noise.accuracy, chance + tol);
  }
}

TEST(TaskData, DeterministicPerSeedAndTrainDisjointFromHeldOut) {
  for (const auto& s : small_settings()) {
    SCOPED_TRACE(s.label());
    std::set<std::vector<int64_t>> train, test;
    for (int64_t i = 0; i < 200; ++i) {
      const ProbeSeq a = task_instance(s, 42, TaskSplit::Train, i, s.length);
      const ProbeSeq b = task_instance(s, 42, TaskSplit::Train, i, s.length);
      ASSERT_EQ(a.tokens, b.tokens);
      ASSERT_EQ(a.answer_pos, b.answer_pos);
      EXPECT_EQ(tokens_hash(a.tokens) & 1, 0u);
      train.insert(a.tokens);
      const ProbeSeq h = task_instance(s, 42, TaskSplit::HeldOut, i, s.length);
      EXPECT_EQ(tokens_hash(h.tokens) & 1, 1u);
      test.insert(h.tokens);
    }
    for (const auto& t : test) EXPECT_EQ(train.count(t), 0u);
    // another seed gives other instances
    EXPECT_NE(task_instance(s, 42, TaskSplit::Train, 0, s.length).tokens,
              task_instance(s, 43, TaskSplit::Train, 0, s.length).tokens);
    if (s.task != "parity") {  // parity at 8 bits has 128 training strings
      EXPECT_GT(train.size(), 150u);
    }
  }
}

TEST(TaskData, LengthGeneralisationInstancesAreLonger) {
  for (const std::string t : {"s3", "s5", "parity"}) {
    SCOPED_TRACE(t);
    const TaskInfo& info = task_info(t);
    ASSERT_TRUE(info.length_generalisation);
    const TasksPreset p = tasks_preset("cpu-tiny");
    const auto grid = task_grid(p, {t});
    ASSERT_EQ(grid.size(), 1u);
    const TaskSetting& s = grid[0];
    ASSERT_EQ(s.test_lengths, (std::vector<int64_t>{s.length, 2 * s.length, 4 * s.length}));
    const ProbeSeq base = task_instance(s, 1, TaskSplit::HeldOut, 0, s.length);
    for (int64_t k : {2, 4}) {
      const ProbeSeq q = task_instance(s, 1, TaskSplit::HeldOut, 0, k * s.length);
      EXPECT_EQ(int64_t(q.answer_pos.size()), k * int64_t(base.answer_pos.size()));
      EXPECT_GE(q.tokens.size(), size_t(k) * (base.tokens.size() - 4));  // s3/s5: a 4-token frame
    }
    // the model's sequence length holds the longest held-out instance and its BOS
    EXPECT_EQ(task_model_seq_len(s), int64_t(task_instance(s, 1, TaskSplit::HeldOut, 0, 4 * s.length).tokens.size()) + 1);
  }
}

TEST(TaskData, MqarFollowsZoologysLayout) {
  const int64_t V = 128, pairs = 8, L = 64;
  const ProbeSeq q = task_mqar(9, L, pairs, V);
  ASSERT_EQ(int64_t(q.tokens.size()), L);
  ASSERT_EQ(int64_t(q.answer_pos.size()), pairs);
  std::set<int64_t> keys, vals;
  for (int64_t i = 0; i < pairs; ++i) {
    keys.insert(q.tokens[size_t(2 * i)]);
    vals.insert(q.tokens[size_t(2 * i + 1)]);
    EXPECT_GE(q.tokens[size_t(2 * i)], 1);
    EXPECT_LT(q.tokens[size_t(2 * i)], V / 2);
    EXPECT_GE(q.tokens[size_t(2 * i + 1)], V / 2);
  }
  EXPECT_EQ(int64_t(keys.size()), pairs);
  EXPECT_EQ(int64_t(vals.size()), pairs);
  std::set<int64_t> queried;
  for (int64_t p : q.answer_pos) {
    EXPECT_EQ((p - 2 * pairs) % 2, 1);  // a query at an even offset of the query region, its value next
    queried.insert(q.tokens[size_t(p - 1)]);
  }
  EXPECT_EQ(queried, keys);  // every key queried once
  // the power law puts queries near the pairs: over many instances, most gaps are small
  int64_t near = 0, total = 0;
  for (int64_t i = 0; i < 200; ++i)
    for (int64_t p : task_mqar(uint64_t(i), 256, 4, 8192).answer_pos) {
      near += (p - 8) / 2 < 31;
      ++total;
    }
  EXPECT_GT(double(near) / double(total), 0.5);  // uniform over 124 gaps would give 25%
}

TEST(TaskData, BadSettingsAreInputErrors) {
  EXPECT_THROW(check_task_setting({"mqar", 64, 17, 64, 8192, {64}}), InputError);  // 4·pairs > length
  EXPECT_THROW(check_task_setting({"mqar", 63, 4, 64, 8192, {63}}), InputError);   // odd length
  EXPECT_THROW(check_task_setting({"mqar", 64, 8, 64, 16, {64}}), InputError);     // too few keys
  EXPECT_THROW(check_task_setting({"parity", 8, 2, 64, 0, {8}}), InputError);      // pairs on another task
  EXPECT_THROW(check_task_setting({"selective_copy", 2, 0, 64, 0, {2}}), InputError);
  EXPECT_THROW(task_info("mqar2"), UsageError);
}

TEST(TaskTraining, BatchTargetsOnlyAtAnswersAndLossIsMaskedMean) {
  const TaskSetting s{"mqar", 32, 4, 32, 64, {32}};
  std::vector<ProbeSeq> seqs = {task_instance(s, 1, TaskSplit::Train, 0, 32), task_instance(s, 1, TaskSplit::Train, 1, 32)};
  at::Tensor x, y;
  task_batch(seqs, 33, 64, x, y);
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{2, 33}));
  EXPECT_EQ((y != -1).sum().item<int64_t>(), 8);
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_EQ(x[b][0].item<int64_t>(), 64);  // BOS
    for (int64_t p : seqs[size_t(b)].answer_pos) {
      EXPECT_EQ(y[b][p].item<int64_t>(), seqs[size_t(b)].tokens[size_t(p)]);
      EXPECT_EQ(x[b][p + 1].item<int64_t>(), seqs[size_t(b)].tokens[size_t(p)]);  // column p predicts column p+1
    }
  }
  // model_loss: the mean cross-entropy over the answer columns only
  const MethodSpec& ms = Registry::get().method("dense_full");
  Config cfg = ms.config.parse(task_model_config(ms, tasks_preset("cpu-tiny"), s));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  Model m = build_model(ms, cfg, gen, at::TensorOptions().dtype(at::kFloat), true);
  at::Tensor lm;
  model_loss(m, x, y, Backend::CPU, &lm);
  at::Tensor logp = at::log_softmax(model_forward(m, x, Backend::CPU).to(at::kDouble), -1);
  double sum = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t p : seqs[size_t(b)].answer_pos) sum -= logp[b][p][seqs[size_t(b)].tokens[size_t(p)]].item<double>();
  EXPECT_NEAR(lm.item<double>(), sum / 8, 1e-4);
  EXPECT_THROW(task_batch(seqs, 32, 64, x, y), InputError);  // no room for the BOS
}

TEST(TaskTraining, GridAndLineup) {
  const TasksPreset tiny = tasks_preset("cpu-tiny"), gpu = tasks_preset("gpu");
  EXPECT_THROW(tasks_preset("huge"), UsageError);
  EXPECT_EQ(tasks_methods(gpu, {}).size(), Registry::get().methods().size());
  EXPECT_EQ(tasks_methods(tiny, {}), tiny.lineup);
  EXPECT_THROW(tasks_methods(tiny, {"dense_fulll"}), UsageError);
  EXPECT_EQ(gpu.seeds, 3);
  // MQAR: every (length, pairs) with 4·pairs <= length at every width, as Zoology's grid
  int64_t n = 0;
  for (int64_t L : gpu.mqar_lengths)
    for (int64_t p : gpu.mqar_pairs) n += 4 * p <= L ? int64_t(gpu.mqar_widths.size()) : 0;
  const auto grid = task_grid(gpu, {"mqar"});
  EXPECT_EQ(int64_t(grid.size()), n);
  for (const auto& s : grid) EXPECT_LE(4 * s.pairs, s.length);
  EXPECT_EQ(task_grid(gpu, {}).size(), grid.size() + 9);  // one setting per other task
  EXPECT_THROW(task_grid(tiny, {"nope"}), UsageError);
}

// --vocab replaces the MQAR vocabulary: the rows and the model's embedding follow it.
namespace {
// dense_full on one MQAR setting (length 16, 2 pairs, width 64) for 2 steps.
TasksOptions one_mqar_setting() {
  TasksOptions o;
  o.methods = {"dense_full"};
  o.tasks = {"mqar"};
  o.steps = 2;
  o.mqar_lengths = {16};
  o.mqar_pairs = {2};
  o.mqar_widths = {64};
  return o;
}
}  // namespace

TEST(TaskTraining, MqarVocabularyOption) {
  TasksOptions o = one_mqar_setting();
  o.mqar_vocab = 40;
  const Json rows = run_tasks(o);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["status"], "ok") << rows[0].dump();
  EXPECT_EQ(rows[0]["setting"]["vocab"], 40);
  EXPECT_DOUBLE_EQ(rows[0]["chance"].get<double>(), 1.0 / 20.0);  // values from [20, 40)
  o.mqar_vocab = -1;
  EXPECT_THROW(run_tasks(o), UsageError);
}

// Length extrapolation and model overrides: --test-scales scores each trained model at multiples of
// its training length (the model's sequence length covering the longest), --config reaches every
// method's model config, and bad values of either are refused before any training.
TEST(TaskTraining, HeldOutScalesAndConfigOverrides) {
  TasksOptions o = one_mqar_setting();
  o.test_scales = {1, 2, 4};
  o.config = "rope=false";
  const Json rows = run_tasks(o);
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i]["status"], "ok") << rows[i].dump();
    EXPECT_EQ(rows[i]["setting"]["length"], 16);
    EXPECT_EQ(rows[i]["setting"]["test_length"], 16 << i) << rows[i].dump();
  }
  TasksPreset p = tasks_preset("cpu-tiny");
  p.test_scales = {1, 8};
  const TaskSetting s = task_grid(p, {"mqar"}).at(0);
  EXPECT_EQ(s.test_lengths, (std::vector<int64_t>{s.length, 8 * s.length}));
  EXPECT_EQ(task_model_seq_len(s), 8 * s.length + 1);
  const MethodSpec& ms = Registry::get().method("dense_full");
  EXPECT_TRUE(ms.config.parse(task_model_config(ms, p, s)).b("rope"));
  p.config = "rope=false";
  EXPECT_FALSE(ms.config.parse(task_model_config(ms, p, s)).b("rope"));
  TasksOptions bad = o;
  bad.test_scales = {0};
  EXPECT_THROW(run_tasks(bad), UsageError);
  bad = o;
  bad.config = "no_such_knob=1";
  EXPECT_THROW(run_tasks(bad), UsageError);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--test-scales", "0", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--config", "no_such_knob=1", "--quiet"}), 2);
}

TEST(TaskTraining, SkippedRowsAndReportMatchTheSchema) {
  TasksOptions o;
  o.methods = {"dense_full"};
  o.tasks = {"mqar", "parity"};
  o.steps = 3;
  o.mqar_lengths = {16};
  o.mqar_pairs = {2};
  o.mqar_widths = {48, 64};  // 48 is not a multiple of head_dim 32: the config is refused
  const Json rows = run_tasks(o);
  ASSERT_EQ(rows.size(), 2u + 3u);  // two MQAR widths, parity at three lengths
  EXPECT_EQ(rows[0]["status"], "skipped");
  EXPECT_NE(rows[0]["reason"].get<std::string>().find("divisible"), std::string::npos);
  EXPECT_EQ(rows[1]["status"], "ok");
  EXPECT_EQ(rows[1]["steps"], 3);
  for (size_t i = 2; i < 5; ++i) EXPECT_EQ(rows[i]["setting"]["test_length"], 8 << (i - 2));
  RunInfo info;
  info.kind = "tasks";
  info.argv = {"mixbench", "tasks"};
  Json report = make_report(info, rows);
  EXPECT_TRUE(validate_json(report, report_schema()).empty());
  // a row without its accuracy, or an unknown task, is not a tasks report
  Json broken = report;
  broken["results"][1].erase("accuracy");
  EXPECT_FALSE(validate_json(broken, report_schema()).empty());
  broken = report;
  broken["results"][1]["task"] = "nope";
  EXPECT_FALSE(validate_json(broken, report_schema()).empty());
  // the pages: a table per task, the heat table with the skipped cell
  const std::string md = tasks_markdown(rows);
  EXPECT_NE(md.find("### mqar"), std::string::npos);
  EXPECT_NE(md.find("### parity"), std::string::npos);
  EXPECT_NE(md.find("| dense_full | skipped |"), std::string::npos);
  const std::string html = tasks_html(rows, "t");
  EXPECT_NE(html.find("<h2>Length generalisation</h2>"), std::string::npos);
  EXPECT_NE(html.find("<h2>MQAR</h2>"), std::string::npos);
  EXPECT_NE(html.find(">skipped</td>"), std::string::npos);
  // MQAR alone is held out at its training length only: no length-generalisation panel
  const Json mqar_rows = Json::array({rows[0], rows[1]});
  EXPECT_EQ(tasks_html(mqar_rows, "t").find("Length generalisation"), std::string::npos);
}

TEST(TaskCommand, BadInputExitsTwo) {
  const std::string out = (tasks_tmp() / "bad.json").string();
  EXPECT_EQ(run_cli({"tasks", "--tasks", "nope", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--methods", "dense_fulll", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--preset", "huge", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--pairs", "0", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--pairs", "x", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--lengths", "33", "--pairs", "2", "--quiet"}), 2);  // odd length
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--lengths", "16", "--pairs", "8", "--quiet"}), 2);  // empty grid
  EXPECT_EQ(run_cli({"tasks", "--device", "tpu", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--seeds", "-1", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--lr", "-1", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--lr", "fast", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--vocab", "-4", "--quiet"}), 2);
  EXPECT_EQ(run_cli({"tasks", "--tasks", "mqar", "--vocab", "8", "--pairs", "4", "--quiet"}), 2);  // 3 keys < 4 pairs
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(run_cli({"tasks", "--help"}), 0);
}

// The CI preset end to end: under 3 minutes on the CPU, JSON + Markdown + HTML written, and dense
// attention learns the easy MQAR setting well above chance.
TEST(TaskCommand, CpuTinyPresetRunsAndDenseLearnsMqar) {
  const fs::path out = tasks_tmp() / "tiny" / "tasks.json";
  fs::create_directories(out.parent_path());
  ASSERT_EQ(run_cli({"tasks", "--preset", "cpu-tiny", "--out", out.string(), "--quiet"}), 0);
  const Json report = Json::parse(read_file(out.string()));
  EXPECT_TRUE(validate_json(report, report_schema()).empty());
  EXPECT_EQ(report["kind"], "tasks");
  ASSERT_TRUE(fs::exists(fs::path(out).replace_extension(".md")));
  const std::string html = read_file(fs::path(out).replace_extension(".html").string());
  EXPECT_NE(html.find("<svg"), std::string::npos);
  bool found = false;
  for (const auto& r : report["results"]) {
    EXPECT_EQ(r["status"], "ok") << r.dump();
    if (r["method"] == "dense_full" && r["task"] == "mqar" && r["setting"]["pairs"] == 2) {
      found = true;
      EXPECT_GT(r["accuracy"].get<double>(), r["chance"].get<double>() + 0.1) << r.dump();  // 0.262 vs 0.125 at seed 0
    }
    if (r["method"] == "dense_full" && r["task"] == "parity" && r["setting"]["test_length"] == r["setting"]["length"])
      EXPECT_GT(r["accuracy"].get<double>(), 0.9) << r.dump();  // 1.0 at seed 0
  }
  EXPECT_TRUE(found);
}
