// Tests of the leaderboard's seeds: the statistics on hand-made values (means, sds, t-intervals,
// paired differences, shared ranks), the rows and tables built from per-seed results, the
// report schema's rule for several seeds, the seed's data order, label placement on the HTML
// page's scatter plots, and an interrupted leaderboard finished by a rerun.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <unistd.h>

#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/report.h"
#include "reports/leaderboard.h"
#include "reports/plot.h"
#include "suites/stats.h"
#include "suites/leaderboard.h"
#include "suites/train.h"
#include "suites/train_data.h"
#include "tests/leaderboard_rows.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {
// This process's scratch folder.
const fs::path& lb_tmp() {
  static const fs::path dir = mixbench_test::scratch_dir("lb_stats_test");
  return dir;
}

using mixbench_test::count_of;

// A per-seed train result as run_leaderboard collects it (2 steps), with its probes and calibration.
Json run_row(const std::string& method, uint64_t seed, double bpb, double tps) {
  Json r = mixbench_test::leaderboard_run_row(method, seed, bpb, tps, 1.5e6, 2);
  r["probes"] = {{"mqar", {{"accuracy", bpb / 10}, {"exact", 0.0}, {"chance", 0.1}}}};
  r["calibration"] = {{"n_layer", 2}, {"d_model", 64}, {"mlp_hidden", 256}, {"residual", 0.0}, {"within_2pct", true}};
  return r;
}
}  // namespace

// ------------------------------------------------------------------ statistics
TEST(LeaderboardStats, MeanSdAndTInterval) {
  const std::vector<double> x = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(mean(x), 2.5);
  EXPECT_NEAR(sample_sd(x), std::sqrt(5.0 / 3.0), 1e-12);
  const auto ci = ci95(x);
  ASSERT_TRUE(ci.has_value());
  const double h = 3.18244631 * std::sqrt(5.0 / 3.0) / 2.0;  // t(0.975, 3)·sd/√4
  EXPECT_NEAR(ci->lo, 2.5 - h, 1e-7);
  EXPECT_NEAR(ci->hi, 2.5 + h, 1e-7);
  // one value: no spread, no interval
  EXPECT_TRUE(std::isnan(sample_sd({3.0})));
  EXPECT_FALSE(ci95({3.0}).has_value());
  EXPECT_THROW(mean({}), InputError);
}

TEST(LeaderboardStats, StudentTQuantiles) {
  EXPECT_NEAR(t_quantile_975(1), 12.7062, 1e-4);
  EXPECT_NEAR(t_quantile_975(2), 4.3027, 1e-4);
  EXPECT_NEAR(t_quantile_975(10), 2.2281, 1e-4);
  EXPECT_NEAR(t_quantile_975(30), 2.0423, 1e-4);
  EXPECT_NEAR(t_quantile_975(31), 1.9600, 1e-4);  // the normal beyond the table
  EXPECT_NEAR(t_quantile_975(1000), 1.9600, 1e-4);
  for (int64_t df = 2; df <= 31; ++df) EXPECT_LT(t_quantile_975(df), t_quantile_975(df - 1)) << df;
  EXPECT_THROW(t_quantile_975(0), InputError);
}

TEST(LeaderboardStats, PairedDifferenceBySeed) {
  const PairedDifference d = paired_difference({3, 4, 6}, {1, 2, 3});
  EXPECT_EQ(d.per_seed, (std::vector<double>{2, 2, 3}));
  EXPECT_NEAR(d.mean, 7.0 / 3.0, 1e-12);
  ASSERT_TRUE(d.ci95.has_value());
  // sd = √(1/3), half-width t(2)·sd/√3 = t(2)/3
  EXPECT_NEAR(d.ci95->lo, 7.0 / 3.0 - 4.30265273 / 3.0, 1e-7);
  EXPECT_NEAR(d.ci95->hi, 7.0 / 3.0 + 4.30265273 / 3.0, 1e-7);
  // the pairing removes the seeds' common shift: a constant difference has a zero-width interval
  const PairedDifference c = paired_difference({1.5, 2.5, 10.5}, {1, 2, 10});
  EXPECT_NEAR(c.ci95->hi - c.ci95->lo, 0.0, 1e-12);
  EXPECT_FALSE(paired_difference({2}, {1}).ci95.has_value());
  EXPECT_THROW(paired_difference({1, 2}, {1}), InputError);
  EXPECT_THROW(paired_difference({}, {}), InputError);
}

TEST(LeaderboardStats, RanksSharedWhereIntervalsOverlap) {
  // A and B overlap, C and D overlap, E stands alone; F overlaps C, D and E
  const std::vector<double> m = {1.5, 2.0, 3.5, 4.2, 10.5, 6.0};
  const std::vector<std::optional<Interval>> ci = {Interval{1, 2},   Interval{1.5, 2.5}, Interval{3, 4},
                                                   Interval{3.5, 5}, Interval{9, 11},    Interval{3.8, 9.5}};
  const std::vector<RankRange> r = shared_ranks(m, ci);
  std::vector<std::string> s;
  for (const auto& x : r) s.push_back(x.str());
  EXPECT_EQ(s, (std::vector<std::string>{"1–2", "1–2", "3–5", "3–5", "5–6", "3–6"}));
  EXPECT_TRUE(r[0].shared());
  // disjoint intervals: distinct ranks
  const auto d = shared_ranks({2, 1}, {Interval{1.9, 2.1}, Interval{0.9, 1.1}});
  EXPECT_EQ(d[0].str(), "2");
  EXPECT_EQ(d[1].str(), "1");
  EXPECT_FALSE(d[0].shared());
  // single runs: ranks by the means, equal means in input order
  const auto p = shared_ranks({3, 1, 2, 1}, {std::nullopt, std::nullopt, std::nullopt, std::nullopt});
  EXPECT_EQ(p[0].str(), "4");
  EXPECT_EQ(p[1].str(), "1");
  EXPECT_EQ(p[2].str(), "3");
  EXPECT_EQ(p[3].str(), "2");
  // a single run among entries with intervals: unknown extent, it shares every rank and widens the others'
  const auto mixed = shared_ranks({1.0, 2.0, 1.5, 3.0}, {Interval{0.9, 1.1}, Interval{1.9, 2.1}, std::nullopt, Interval{2.9, 3.1}});
  std::vector<std::string> ms;
  for (const auto& x : mixed) ms.push_back(x.str());
  EXPECT_EQ(ms, (std::vector<std::string>{"1–2", "2–3", "1–4", "3–4"}));
  EXPECT_THROW(shared_ranks({1, 2}, {std::nullopt}), InputError);
}

// ------------------------------------------------------------------ rows and tables from per-seed results
TEST(LeaderboardStats, RowsCarryMeansIntervalsDeltasAndRanks) {
  // base: 2.0, 2.2, 2.4; good: base − 1.5 exactly (a zero-width paired interval); close: base ± noise
  std::vector<Json> runs;
  const double base[] = {2.0, 2.2, 2.4}, close[] = {2.05, 2.1, 2.5};
  for (uint64_t s = 0; s < 3; ++s) {
    runs.push_back(run_row("base", 10 + s, base[s], 100 + 10 * double(s)));
    runs.push_back(run_row("good", 10 + s, base[s] - 1.5, 50));
    runs.push_back(run_row("close", 10 + s, close[s], 200));
  }
  runs.back()["mfu"] = 0.3;  // only one seed of one method carries an MFU: no mean for it
  std::string md;
  const Json rows = leaderboard_rows({"base", "good", "close"}, runs, "base", md);
  ASSERT_EQ(rows.size(), 3u);
  const Json& b = rows[0];
  const Json& g = rows[1];
  const Json& c = rows[2];
  EXPECT_EQ(b["method"], "base");
  EXPECT_NEAR(b["val_bpb"].get<double>(), 2.2, 1e-12);
  EXPECT_EQ(b["val_bpb_seeds"], Json({2.0, 2.2, 2.4}));
  EXPECT_NEAR(b["val_bpb_sd"].get<double>(), 0.2, 1e-12);
  const double h = 4.30265273 * 0.2 / std::sqrt(3.0);
  EXPECT_NEAR(b["val_bpb_ci95"][0].get<double>(), 2.2 - h, 1e-7);
  EXPECT_NEAR(b["val_bpb_ci95"][1].get<double>(), 2.2 + h, 1e-7);
  EXPECT_NEAR(b["tokens_per_s"].get<double>(), 110.0, 1e-9);
  EXPECT_EQ(b["seeds"], Json({10, 11, 12}));
  EXPECT_EQ(b["runs"].size(), 3u);
  EXPECT_NEAR(b["probes"]["mqar"]["accuracy"].get<double>(), 0.22, 1e-12);  // the mean over the seeds
  EXPECT_EQ(b["delta_vs_base"].get<double>(), 0.0);
  EXPECT_NEAR(g["delta_vs_base"].get<double>(), -1.5, 1e-12);
  EXPECT_NEAR(g["delta_vs_base_ci95"][0].get<double>(), -1.5, 1e-9);
  EXPECT_NEAR(g["delta_vs_base_ci95"][1].get<double>(), -1.5, 1e-9);
  EXPECT_FALSE(c.contains("mfu"));
  // good's interval [0.7 ± h] lies below the others', which overlap each other
  EXPECT_EQ(g["rank"], "1");
  EXPECT_EQ(b["rank"], "2–3");
  EXPECT_EQ(c["rank"], "2–3");
  // the table: best first, mean ± sd, intervals, the paired delta with its interval, ties marked
  EXPECT_NE(md.find("3 seeds per method"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 | good | 0.7000 ± 0.2000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2–3 = | base | 2.2000 ± 0.2000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| -1.5000 | [-1.5000, -1.5000] |"), std::string::npos) << md;
  EXPECT_NE(md.find("= tied"), std::string::npos) << md;
  EXPECT_LT(md.find("| good |"), md.find("| base |"));
  // every seed of a method carries an MFU: its mean is reported and the table gets the column
  for (auto& r : runs)
    if (r["method"] == "close") r["mfu"] = r["seed"] == 10 ? 0.2 : 0.4;
  const Json rows2 = leaderboard_rows({"base", "good", "close"}, runs, "base", md);
  EXPECT_NEAR(rows2[2]["mfu"].get<double>(), (0.2 + 0.4 + 0.4) / 3, 1e-12);
  EXPECT_NE(md.find("| MFU |"), std::string::npos);
  EXPECT_NE(md.find("| 33.3% |"), std::string::npos) << md;  // as a percentage
}

TEST(LeaderboardStats, SingleSeedRowsHaveNoIntervals) {
  std::vector<Json> runs = {run_row("base", 0, 2.0, 100), run_row("other", 0, 2.0, 90), run_row("third", 0, 1.0, 90)};
  std::string md;
  const Json rows = leaderboard_rows({"base", "other", "third"}, runs, "base", md);
  EXPECT_TRUE(rows[0]["val_bpb_ci95"].is_null());
  EXPECT_TRUE(rows[0]["val_bpb_sd"].is_null());
  EXPECT_TRUE(rows[1]["delta_vs_base_ci95"].is_null());
  EXPECT_EQ(rows[1]["delta_vs_base"].get<double>(), 0.0);
  EXPECT_EQ(rows[2]["rank"], "1");
  EXPECT_EQ(rows[0]["rank"], "2");  // distinct ranks by the value as before, input order between equals
  EXPECT_EQ(rows[1]["rank"], "3");
  EXPECT_NE(md.find("single seed"), std::string::npos);
  EXPECT_NE(md.find("| 2 = | base |"), std::string::npos) << md;  // the equal values are marked
  EXPECT_NE(md.find("| 1 | third |"), std::string::npos) << md;
  // a failed seed makes the method an error row, kept out of the ranking
  runs.push_back(run_row("third", 1, 1.0, 90));
  runs.back() = {{"status", "error"}, {"method", "third"}, {"seed", 1}, {"message", "out of memory"}};
  const Json rows2 = leaderboard_rows({"base", "other", "third"}, runs, "base", md);
  EXPECT_EQ(rows2[2]["status"], "error");
  EXPECT_NE(rows2[2]["message"].get<std::string>().find("seed 1: out of memory"), std::string::npos);
  EXPECT_FALSE(rows2[2].contains("rank"));
  EXPECT_NE(md.find("third: error: seed 1: out of memory"), std::string::npos);
}

// ------------------------------------------------------------------ the schema's rule for several seeds
TEST(LeaderboardStats, SchemaRefusesAMultiSeedReportWithoutPerSeedValues) {
  std::string md;
  const Json rows = leaderboard_rows({"a", "b"}, {run_row("a", 0, 2, 9), run_row("a", 1, 2.1, 9), run_row("b", 0, 3, 9),
                                                  run_row("b", 1, 3.2, 9)},
                                     "a", md);
  RunInfo info;
  info.kind = "leaderboard";
  info.argv = {"mixbench", "leaderboard"};
  info.config = {{"preset", "tiny"}, {"seeds", 2}};
  Json report = make_report(info, rows);
  EXPECT_TRUE(validate_json(report, report_schema()).empty()) << validate_json(report, report_schema())[0];
  Json stripped = report;
  stripped["results"][1].erase("val_bpb_seeds");
  EXPECT_FALSE(validate_json(stripped, report_schema()).empty());
  EXPECT_THROW(write_report((lb_tmp() / "refused.json").string(), stripped), std::logic_error);
  // one seed: the per-seed values are not required (reports written before them stay valid)
  stripped["config"]["seeds"] = 1;
  EXPECT_TRUE(validate_json(stripped, report_schema()).empty());
  // a malformed rank or interval is refused
  Json bad = report;
  bad["results"][0]["rank"] = "first";
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = report;
  bad["results"][0]["val_bpb_ci95"] = Json::array({1.0});
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
}

TEST(LeaderboardStats, PresetsDeclareTheirSeeds) {
  EXPECT_EQ(train_preset("tiny").seeds, 1);
  EXPECT_EQ(train_preset("small").seeds, 3);
}

// ------------------------------------------------------------------ the seed's data order
TEST(LeaderboardStats, DataOrderDependsOnTheSeed) {
  // synthetic data is drawn from the seed
  const Corpus s1 = load_corpus("synthetic", 1), s2 = load_corpus("synthetic", 2);
  EXPECT_FALSE(at::equal(s1.train.slice(0, 0, 4096), s2.train.slice(0, 0, 4096)));
  // a file's documents are concatenated in an order drawn from the seed (seed 0 included)
  const fs::path dir = lb_tmp() / "docs";
  fs::create_directories(dir);
  for (int i = 0; i < 20; ++i) write_file_atomic((dir / fmt::format("d{:02}.txt", i)).string(), fmt::format("document {} text\n", i));
  const Corpus c0 = load_corpus(dir.string(), 0), c1 = load_corpus(dir.string(), 1), c2 = load_corpus(dir.string(), 2);
  const Corpus plain = text_corpus(dir.string());
  // the stream cut at its BOS marks: its documents in stream order
  auto documents = [](const at::Tensor& s) {
    std::vector<std::vector<int64_t>> d;
    for (int64_t i = 0; i < s.size(0); ++i) {
      if (s[i].item<int64_t>() == kByteBos || d.empty()) d.emplace_back();
      d.back().push_back(s[i].item<int64_t>());
    }
    return d;
  };
  const auto docs = documents(plain.train);
  ASSERT_GE(docs.size(), 10u);
  for (const Corpus* c : {&c0, &c1, &c2}) {
    EXPECT_EQ(c->hash, plain.hash);  // the same data, another order
    EXPECT_EQ(c->order, data_order(dir.string()));
    ASSERT_EQ(c->train.size(0), plain.train.size(0));
    EXPECT_EQ(c->train[0].item<int64_t>(), kByteBos);
    auto d = documents(c->train);
    EXPECT_NE(d, docs);  // reordered
    std::sort(d.begin(), d.end());
    auto sorted = docs;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(d, sorted);  // whole documents, each once
    EXPECT_TRUE(at::equal(c->val, plain.val));  // validation stays the same
  }
  EXPECT_FALSE(at::equal(c1.train, c2.train));
  EXPECT_FALSE(at::equal(c0.train, c1.train));
  EXPECT_TRUE(at::equal(c1.train, load_corpus(dir.string(), 1).train));  // the seed decides it
  // the first half of the stream draws on both halves of the file order (not a rotation's run of neighbours)
  {
    const auto d1 = documents(c1.train);
    std::set<std::vector<int64_t>> first(d1.begin(), d1.begin() + long(d1.size() / 2));
    int early = 0, late = 0;
    for (size_t i = 0; i < docs.size(); ++i)
      if (first.count(docs[i])) (i < docs.size() / 2 ? early : late)++;
    EXPECT_GT(early, 0);
    EXPECT_GT(late, 0);
  }
  // a stream without document marks is rotated to an offset drawn from the seed
  Corpus flat;
  flat.train = at::arange(1000, at::TensorOptions().dtype(at::kLong)) % 200;
  flat.val = flat.train.slice(0, 0, 10);
  const at::Tensor before = flat.train.clone();
  shuffle_train_documents(flat, 3);
  ASSERT_EQ(flat.train.size(0), 1000);
  bool rotation = false;
  for (int64_t off = 0; off < 1000 && !rotation; ++off)
    rotation = at::equal(flat.train, at::cat({before.slice(0, off), before.slice(0, 0, off)}));
  EXPECT_TRUE(rotation);
  EXPECT_FALSE(at::equal(flat.train, before));
}

// Cells trained with another data order (or without one recorded: before documents were permuted)
// are not combined with this run's.
TEST(LeaderboardStats, CellsOfAnotherDataOrderAreRefused) {
  LeaderboardOptions opt;
  opt.preset = "tiny";
  opt.data = "synthetic";
  const nlohmann::json config = leaderboard_config(opt);
  ASSERT_EQ(config.at("data_order"), data_order("synthetic"));
  nlohmann::json report = {{"kind", "leaderboard"}, {"config", config}, {"results", nlohmann::json::array()}};
  EXPECT_NO_THROW(check_leaderboard_resume(report, config));
  for (const nlohmann::json& order : {nlohmann::json("a document start drawn from the seed"), nlohmann::json()}) {
    nlohmann::json old = report;
    if (order.is_null()) old["config"].erase("data_order");
    else old["config"]["data_order"] = order;
    try {
      check_leaderboard_resume(old, config);
      ADD_FAILURE() << "accepted data_order " << order.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("data_order"), std::string::npos) << e.what();
    }
  }
}

// ------------------------------------------------------------------ label placement and the page
TEST(LeaderboardStats, LabelsNeverOverlapOnCoincidentPoints) {
  // twelve labels on one point, three more a pixel apart, two at the area's corner
  std::vector<std::pair<double, double>> pts, sizes;
  for (int i = 0; i < 12; ++i) pts.emplace_back(200, 150);
  for (int i = 0; i < 3; ++i) pts.emplace_back(203 + i, 151);
  pts.emplace_back(100, 50);
  pts.emplace_back(100, 50);
  for (size_t i = 0; i < pts.size(); ++i) sizes.emplace_back(text_width(fmt::format("method_{}", i), 10), 12);
  const LabelBox area{100, 50, 300, 200};
  const std::vector<PlacedLabel> placed = place_labels(pts, sizes, area);
  ASSERT_EQ(placed.size(), pts.size());
  for (size_t i = 0; i < placed.size(); ++i) {
    const LabelBox& b = placed[i].box;
    EXPECT_NEAR(b.w, sizes[i].first, 1e-12);
    EXPECT_TRUE(b.x >= area.x && b.y >= area.y && b.x + b.w <= area.x + area.w && b.y + b.h <= area.y + area.h) << i;
    for (size_t j = 0; j < placed.size(); ++j) {
      if (j != i) {
        EXPECT_FALSE(b.intersects(placed[j].box)) << i << " and " << j;
      }
      EXPECT_FALSE(b.intersects({pts[j].first - 4, pts[j].second - 4, 8, 8})) << "label " << i << " covers point " << j;
    }
  }
  EXPECT_FALSE(placed[0].moved);  // the first label sits beside its point
  EXPECT_TRUE(placed[11].moved);  // later ones on the same point are moved out (with a leader line)
  // an area too small for all of them: still no overlap (labels leave the area)
  const std::vector<PlacedLabel> crowded = place_labels(pts, sizes, {190, 140, 40, 30});
  for (size_t i = 0; i < crowded.size(); ++i)
    for (size_t j = i + 1; j < crowded.size(); ++j) EXPECT_FALSE(crowded[i].box.intersects(crowded[j].box)) << i << " " << j;
  EXPECT_THROW(place_labels(pts, {}, area), InputError);
  // touching boxes do not intersect; overlapping ones do
  EXPECT_FALSE((LabelBox{0, 0, 10, 10}).intersects({10, 0, 5, 5}));
  EXPECT_TRUE((LabelBox{0, 0, 10, 10}).intersects({9.5, 9.5, 5, 5}));
}

TEST(LeaderboardStats, PageHasTablesScatterPlotsAndTheParetoFront) {
  // fast: cheap but worse; best: slow but best; dominated: slower and worse than fast; same: on top of dominated
  std::vector<Json> runs;
  for (uint64_t s = 0; s < 2; ++s) {
    runs.push_back(run_row("best", s, 2.0 + 0.01 * double(s), 100));
    runs.push_back(run_row("fast", s, 2.5 + 0.01 * double(s), 300));
    runs.push_back(run_row("dominated", s, 2.7 + 0.01 * double(s), 200));
    runs.push_back(run_row("<same>&", s, 2.7 + 0.01 * double(s), 200));
  }
  std::string md;
  const Json rows = leaderboard_rows({"best", "fast", "dominated", "<same>&"}, runs, "best", md);
  const std::string page = leaderboard_html(rows, "board", {{"baseline", "best"}});
  EXPECT_EQ(page.find("<pre"), std::string::npos);
  EXPECT_EQ(count_of(page, "<table"), 2u);  // the ranking and the probes
  EXPECT_EQ(count_of(page, "<svg"), 3u);
  EXPECT_NE(page.find("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"560\" height=\"400\" viewBox=\"0 0 560 400\" "
                      "font-family=\"sans-serif\" class=\"bpb-speed\">"),
            std::string::npos);
  EXPECT_NE(page.find("<th class=\"num\">Δ vs best</th>"), std::string::npos);
  EXPECT_NE(page.find("<td>&lt;same&gt;&amp;</td>"), std::string::npos);
  EXPECT_EQ(page.find("<same>"), std::string::npos);
  EXPECT_EQ(count_of(page, "<g class=\"ci\""), 8u);     // an error bar per method per scatter plot
  EXPECT_EQ(count_of(page, "<circle class=\"front\""), 2u);  // best and fast
  EXPECT_EQ(count_of(page, "<polyline class=\"pareto\""), 1u);
  EXPECT_EQ(count_of(page, "<text class=\"label\""), 8u);
  EXPECT_NE(page.find("<tr class=\"tie\">"), std::string::npos);  // dominated and <same>& share a rank
  // one seed: the page says so
  const Json single = leaderboard_rows({"best", "fast"}, {runs[0], runs[1]}, "best", md);
  const std::string p1 = leaderboard_html(single, "board", {{"baseline", "best"}});
  EXPECT_NE(p1.find("single seed"), std::string::npos);
  EXPECT_EQ(count_of(p1, "<g class=\"ci\""), 0u);
}

// --budgets: one section per budget (its own table, plots and curves), then τ between them; a row
// of one budget never appears in another's table or plots.
TEST(LeaderboardStats, PageHasASectionPerBudget) {
  std::vector<Json> runs;
  for (uint64_t s = 0; s < 2; ++s) {
    runs.push_back(run_row("best", s, 2.0 + 0.01 * double(s), 100));
    runs.push_back(run_row("fast", s, 2.5 + 0.01 * double(s), 300));
  }
  std::string md;
  Json rows = Json::array();
  for (const auto& [label, steps] : std::vector<std::pair<std::string, int64_t>>{{"steps=600", 600}, {"steps=1200", 1200}})
    for (Json r : leaderboard_rows({"best", "fast"}, runs, "best", md)) {
      r["budget"] = {{"budget", label}, {"steps", steps}, {"tokens", steps * 16}};
      if (label == "steps=1200") r["method"] = r["method"].get<std::string>() + "_long";
      rows.push_back(r);
    }
  const Json summary = {{"baseline", "best"},
                        {"kendall_tau", Json::array({{{"a", "steps=600"}, {"b", "steps=1200"}, {"methods", 2}, {"tau", 1.0}}})}};
  const std::string page = leaderboard_html(rows, "board", summary);
  const size_t a = page.find("<h2>budget steps=600 (600 steps, 9600 tokens)</h2>"),
               b = page.find("<h2>budget steps=1200 (1200 steps, 19200 tokens)</h2>"), t = page.find("<h2>Agreement between budgets</h2>");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(t, std::string::npos);
  EXPECT_LT(a, b);
  EXPECT_LT(b, t);
  const std::string first = page.substr(a, b - a), second = page.substr(b, t - b);
  EXPECT_EQ(count_of(first, "<table class=\"ranking\""), 1u);
  EXPECT_EQ(count_of(second, "<table class=\"ranking\""), 1u);
  EXPECT_EQ(count_of(first, "<svg"), 3u);
  EXPECT_EQ(count_of(second, "<svg"), 3u);
  EXPECT_EQ(count_of(first, "_long"), 0u);           // the long budget's rows stay in their section
  EXPECT_NE(second.find("<td>best_long</td>"), std::string::npos);
  EXPECT_EQ(count_of(second, "<td>best</td>"), 0u);
  EXPECT_EQ(count_of(first, "<polyline class=\"loss\""), 2u);  // one curve per method, not per budget and method
  EXPECT_NE(page.find("<tr><td>steps=600 vs steps=1200</td><td class=\"num\">1.000</td><td class=\"num\">2</td></tr>"),
            std::string::npos);
  // one budget: no sections, as before
  Json one = Json::array();
  for (const auto& r : rows)
    if (r["budget"]["budget"] == "steps=600") one.push_back(r);
  const std::string p1 = leaderboard_html(one, "board", {{"baseline", "best"}});
  EXPECT_EQ(p1.find("<h2>budget"), std::string::npos);
  EXPECT_EQ(count_of(p1, "<svg"), 3u);
  // a method that failed (no budget of its own) is listed as failed in the budget's page, not in a
  // section of its own; with two budgets, under each
  const Json failed = {{"method", "broken"}, {"status", "error"}, {"message", "seed 2: CUDA out of memory"}, {"seeds", {1, 2}}};
  Json one_failed = one;
  one_failed.push_back(failed);
  const std::string p2 = leaderboard_html(one_failed, "board", {{"baseline", "best"}});
  EXPECT_EQ(p2.find("without a budget"), std::string::npos);
  EXPECT_EQ(p2.find("<h2>budget"), std::string::npos);
  EXPECT_EQ(count_of(p2, "<svg"), 3u);
  EXPECT_EQ(count_of(p2, "<h2>Failed</h2>"), 1u);
  EXPECT_NE(p2.find("seed 2: CUDA out of memory"), std::string::npos);
  Json two_failed = rows;
  two_failed.push_back(failed);
  const std::string p3 = leaderboard_html(two_failed, "board", summary);
  EXPECT_EQ(p3.find("without a budget"), std::string::npos);
  EXPECT_EQ(count_of(p3, "<h2>budget "), 2u);
  EXPECT_EQ(count_of(p3, "<h2>Failed</h2>"), 2u);
}

// ------------------------------------------------------------------ interrupted and resumed
TEST(LeaderboardStats, AnInterruptedRunIsFinishedByARerun) {
  const fs::path dir = lb_tmp() / "resume";
  fs::create_directories(dir);
  const std::string part = (dir / "part.json").string(), whole = (dir / "whole.json").string();
  const std::vector<std::string> base = {"leaderboard", "--methods", "dense_full,gla", "--config", "seq_len=32", "--steps", "2",
                                         "--batch", "1", "--probes", "0", "--seeds", "2", "--seed", "3"};
  auto run = [&](std::vector<std::string> extra, std::string* out = nullptr, std::string* err = nullptr) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    const int rc = run_cli(args);
    const std::string o = testing::internal::GetCapturedStdout(), e = testing::internal::GetCapturedStderr();
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  };
  std::string out, err;
  // interrupted after 2 of the 4 cells: the report holds them
  ASSERT_EQ(run({"--out", part, "--stop-after", "2"}, &out, &err), 0) << err;
  EXPECT_EQ(count_of(out, "\"state\":\"trained\""), 2u) << out;
  EXPECT_NE(err.find("stopped after 2 of 4 cells"), std::string::npos) << err;
  Json r = Json::parse(read_file(part));
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  EXPECT_FALSE(r["summary"]["complete"].get<bool>());
  EXPECT_EQ(r["summary"]["cells_done"], 2);
  ASSERT_EQ(r["results"].size(), 2u);
  EXPECT_EQ(r["results"][0]["seeds"], Json({3}));  // seed by seed: both methods at the first seed
  // the rerun trains only the two missing cells
  ASSERT_EQ(run({"--out", part}, &out, &err), 0) << err;
  EXPECT_EQ(count_of(out, "\"state\":\"trained\""), 2u) << out;
  EXPECT_EQ(count_of(out, "\"state\":\"kept\""), 2u) << out;
  const Json resumed = Json::parse(read_file(part));
  EXPECT_TRUE(resumed["summary"]["complete"].get<bool>());
  // an uninterrupted run gives the same numbers
  ASSERT_EQ(run({"--out", whole, "--quiet"}), 0);
  const Json straight = Json::parse(read_file(whole));
  EXPECT_TRUE(validate_json(straight, report_schema()).empty());
  ASSERT_EQ(resumed["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Json &a = resumed["results"][i], &b = straight["results"][i];
    EXPECT_EQ(a["method"], b["method"]);
    EXPECT_EQ(a["val_bpb_seeds"].size(), 2u);
    EXPECT_EQ(a["val_bpb_seeds"], b["val_bpb_seeds"]);
    EXPECT_EQ(a["val_bpb"], b["val_bpb"]);
    EXPECT_EQ(a["val_bpb_ci95"], b["val_bpb_ci95"]);
    EXPECT_EQ(a["delta_vs_dense_full"], b["delta_vs_dense_full"]);
    EXPECT_EQ(a["rank"], b["rank"]);
    EXPECT_EQ(a["loss_curve"], b["loss_curve"]);
    EXPECT_EQ(a["seeds"], Json({3, 4}));
  }
  // the seeds change the numbers (initialisation and data order)
  EXPECT_NE(straight["results"][0]["val_bpb_seeds"][0], straight["results"][0]["val_bpb_seeds"][1]);
  // a report of other options is refused, naming the field
  EXPECT_EQ(run({"--out", whole, "--steps", "3", "--quiet"}, &out, &err), 2);
  EXPECT_NE(err.find("steps"), std::string::npos) << err;
  EXPECT_EQ(run({"--out", whole, "--config", "seq_len=16", "--quiet"}, &out, &err), 2);
  EXPECT_NE(err.find("config"), std::string::npos) << err;
  write_file_atomic((dir / "junk.json").string(), "not json");
  EXPECT_EQ(run({"--out", (dir / "junk.json").string(), "--quiet"}, &out, &err), 2);
  EXPECT_EQ(run({"--seeds", "0", "--quiet"}, &out, &err), 2);
  EXPECT_EQ(run({"--stop-after", "-1", "--quiet"}, &out, &err), 2);
}
