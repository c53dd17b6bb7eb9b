// `mixbench profile`: the NVTX filter it hands ncu selects exactly the ranges the harness opens for
// the work (for every registered method and op and each phase it has), ncu's raw CSV page is read
// into per-kernel numbers (a real H200 page as the fixture), and bad input is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include "tests/source_dir.h"
#include "harness/cli/cli.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/nvtx.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "reports/render.h"
#include "suites/sweep.h"
#include "suites/profile.h"

namespace mixbench {
namespace {

namespace fs = std::filesystem;

TEST(Profile, ReadsNcuRawCsv) {
  // ncu 2025.3.1 on an H200: two kernels under one range, one launched from another thread
  const std::string text = read_file((fs::path(mixbench_test::source_dir()) / "tests" / "data" / "ncu_raw_h200.csv").string());
  std::vector<KernelProfile> k = parse_ncu_raw_csv(text);
  ASSERT_EQ(k.size(), 3u);
  EXPECT_EQ(k[0].name, "k_other(float *, int)");
  EXPECT_DOUBLE_EQ(k[0].duration_s, 5184e-9);
  EXPECT_DOUBLE_EQ(k[0].flops, 1048576.0);  // one fadd per element
  EXPECT_DOUBLE_EQ(k[0].dram_bytes, 4197120.0);
  EXPECT_EQ(k[0].registers_per_thread, 16);
  EXPECT_EQ(k[0].grid_size, 4096);
  EXPECT_NE(k[0].nvtx.find("dense.attention.forward"), std::string::npos);
  // a 2048³ bf16 GEMM: 2·2048³ tensor-core FLOPs
  EXPECT_DOUBLE_EQ(k[1].tensor_flops, 2.0 * 2048.0 * 2048.0 * 2048.0);
  EXPECT_DOUBLE_EQ(k[1].flops, k[1].tensor_flops);
  EXPECT_EQ(k[1].registers_per_thread, 168);
  EXPECT_EQ(k[1].shared_mem_dynamic, 213156);
  EXPECT_DOUBLE_EQ(k[1].duration_s, 32608e-9);
  EXPECT_NEAR(k[1].sm_pct, 71.07, 1e-9);
  EXPECT_NEAR(k[1].achieved_occupancy_pct, 14.07, 1e-9);
  EXPECT_DOUBLE_EQ(k[2].flops, 2.0 * 1048576.0);  // one ffma per element
  EXPECT_NE(k[2].nvtx.find("dense.layer.backward"), std::string::npos);
}

TEST(Profile, ReportTotalsRatioAndTruncation) {
  const std::string text = read_file((fs::path(mixbench_test::source_dir()) / "tests" / "data" / "ncu_raw_h200.csv").string());
  std::vector<KernelProfile> k = parse_ncu_raw_csv(text);
  ProfileOptions o;
  o.method = "dense";
  o.device = "cpu";
  o.preset = "cpu-tiny";
  ProfilePlan plan = profile_plan(o);
  nlohmann::json r = profile_report(o, plan, k, 1e10);
  const double flops = k[0].flops + k[1].flops + k[2].flops;
  EXPECT_DOUBLE_EQ(r["totals"]["flops"].get<double>(), flops);
  EXPECT_EQ(r["totals"]["kernels"].get<int>(), 3);
  EXPECT_DOUBLE_EQ(r["measured_over_accountant_flops"].get<double>(), flops / 1e10);
  EXPECT_FALSE(r["launch_count_reached"].get<bool>());
  r["status"] = "pass";
  RunInfo info;
  info.kind = "profile";
  info.argv = {"mixbench", "profile"};
  EXPECT_TRUE(validate_json(make_report(info, nlohmann::json::array({r})), report_schema()).empty());
  // the Markdown summary lists the kernels, longest first
  const std::string md = render_markdown(make_report(info, nlohmann::json::array({r})));
  const size_t gemm = md.find("`nvjet_sm90"), other = md.find("`k_other");
  ASSERT_NE(gemm, std::string::npos) << md;
  ASSERT_NE(other, std::string::npos) << md;
  EXPECT_LT(gemm, other) << "the 32.6 µs GEMM before the 5.2 µs kernel";
  EXPECT_NE(md.find("| kernel | µs |"), std::string::npos);
  // ncu stopped at the launch count: no ratio of a partial total
  o.launch_count = 3;
  nlohmann::json t = profile_report(o, plan, k, 1e10);
  EXPECT_TRUE(t["launch_count_reached"].get<bool>());
  EXPECT_TRUE(t["measured_over_accountant_flops"].is_null());
  // ops have no accountant
  EXPECT_TRUE(std::isnan(profile_accountant_flops([] { ProfileOptions p; p.op = "attention"; return p; }())));
  EXPECT_GT(profile_accountant_flops(o), 0.0);
}

// ncu scales its units to the value (an imported report says "usecond", "Kbyte/block", "Mbyte").
TEST(Profile, UnitsAreConverted) {
  std::string head = "\"ID\",\"Kernel Name\"";
  std::string units = "\"\",\"\"";
  std::string row = "\"0\",\"k\"";
  const std::vector<std::tuple<std::string, std::string, std::string>> cols = {
      {"gpu__time_duration.sum", "usecond", "216.99"},
      {"dram__bytes_read.sum", "Mbyte", "1.50"},
      {"dram__bytes_write.sum", "Kbyte", "2"},
      {"sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "29.8"},
      {"dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "3.95"},
      {"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", "10"},
      {"sm__warps_active.avg.pct_of_peak_sustained_active", "%", "12.5"},
      {"launch__registers_per_thread", "register/thread", "255"},
      {"launch__shared_mem_per_block_static", "byte/block", "0"},
      {"launch__shared_mem_per_block_dynamic", "Kbyte/block", "147.46"},
      {"launch__block_size", "", "256"},
      {"launch__grid_size", "", "1,024"}};
  for (const auto& [n, u, v] : cols) {
    head += ",\"" + n + "\"";
    units += ",\"" + u + "\"";
    row += ",\"" + v + "\"";
  }
  std::vector<KernelProfile> k = parse_ncu_raw_csv(head + "\n" + units + "\n" + row + "\n");
  ASSERT_EQ(k.size(), 1u);
  EXPECT_NEAR(k[0].duration_s, 216.99e-6, 1e-15);
  EXPECT_DOUBLE_EQ(k[0].dram_bytes, 1.5e6 + 2e3);
  EXPECT_EQ(k[0].shared_mem_dynamic, 147460);
  EXPECT_EQ(k[0].registers_per_thread, 255);
  EXPECT_EQ(k[0].grid_size, 1024);
}

TEST(Profile, MalformedCsvIsAnInputError) {
  EXPECT_THROW(parse_ncu_raw_csv(""), InputError);
  EXPECT_THROW(parse_ncu_raw_csv("==WARNING== No kernels were profiled.\n"), InputError);
  EXPECT_THROW(parse_ncu_raw_csv("\"ID\",\"Kernel Name\",\"a\",\"b\"\n\"0\",\"k\",\"1\",\"2\"\n"), InputError);
}

TEST(Profile, BadInputIsAUsageError) {
  ProfileOptions o;
  EXPECT_THROW(profile_plan(o), UsageError);  // neither method nor op
  o.method = "dense";
  o.op = "attention";
  EXPECT_THROW(profile_plan(o), UsageError);  // both
  o.op.clear();
  o.phase = "sideways";
  EXPECT_THROW(profile_plan(o), UsageError);
  o.phase = "forward";
  o.method = "no_such_method";
  EXPECT_THROW(profile_plan(o), UsageError);
  o.method.clear();
  o.op = "attention";
  o.phase = "decode";
  EXPECT_THROW(profile_plan(o), UsageError);  // ops have forward and backward only
  o.op = "no_such_op";
  o.phase = "forward";
  EXPECT_THROW(profile_plan(o), UsageError);
  for (const MethodSpec* m : Registry::get().methods()) {
    if (m->has_decode() || m->is_hybrid()) continue;
    ProfileOptions d;
    d.method = m->name;
    d.phase = "decode";
    EXPECT_THROW(profile_plan(d), UsageError) << m->name << " has no decode path";
  }
  ProfileOptions missing;
  missing.method = "dense";
  missing.ncu = "/nonexistent/ncu";
  EXPECT_THROW(run_profile(missing, "/bin/true", {"mixbench", "profile"}), UsageError);
}

TEST(Profile, StackMatchingIsDirectNesting) {
  EXPECT_TRUE(nvtx_stack_matches({"p", "p.timed", "p.forward", "x"}, {"p.timed", "p.forward"}));
  EXPECT_FALSE(nvtx_stack_matches({"p", "p.timed", "y", "p.forward"}, {"p.timed", "p.forward"}));
  EXPECT_FALSE(nvtx_stack_matches({"p", "p.warmup", "p.forward"}, {"p.timed", "p.forward"}));
  EXPECT_FALSE(nvtx_stack_matches({}, {"a"}));
}

// Runs the plan's sweep point on the CPU (tiny shapes) through the command line, with range
// recording, and returns the recorded stacks.
std::vector<std::vector<std::string>> recorded_work(const ProfilePlan& plan) {
  std::vector<std::string> args = plan.sweep_args;
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--warmup") args[i + 1] = "0";  // the timed repetition opens the same ranges
  args.push_back("--out");
  args.push_back((fs::temp_directory_path() / "mixbench_profile_work.json").string());
  NvtxRange::start_recording();
  const int rc = run_cli(args);
  auto stacks = NvtxRange::recorded_stacks();
  NvtxRange::stop_recording();
  EXPECT_EQ(rc, 0);
  return stacks;
}

// For every registered method and op and every phase it has, the filter selects ranges the work
// really opens, with work nested inside them, and selects nothing of another subject's work.
TEST(Profile, FiltersMatchTheRangesTheWorkOpens) {
  auto check = [](ProfileOptions o, const std::string& what) {
    o.device = "cpu";
    o.dtype = "fp32";
    o.preset = "cpu-tiny";
    o.seq_len = 32;
    ProfilePlan p = profile_plan(o);
    EXPECT_EQ(p.nvtx_include.find("mixbench@"), 0u);
    for (const auto& r : p.range_path) EXPECT_EQ(r.find('/'), std::string::npos) << r << ": '/' splits ncu's filter";
    auto stacks = recorded_work(p);
    int hits = 0, nested = 0;
    for (const auto& s : stacks)
      if (nvtx_stack_matches(s, p.range_path)) {
        ++hits;
        nested += s.size() > p.range_path.size() + 1 ? 1 : 0;
        // a method's op calls inside its phase carry the method's name, not the op-level "op."
        if (o.op.empty()) EXPECT_NE(s.back().rfind("op.", 0), 0u) << what << ": " << s.back();
      }
    EXPECT_GT(hits, 0) << what << ": filter " << p.nvtx_include << " matches no range the work opens";
    if (o.phase == "forward" && o.op.empty()) EXPECT_GT(nested, 0) << what << ": no layer or op range inside " << p.nvtx_include;
    // another subject's filter never selects this work
    ProfileOptions other = o;
    if (!o.method.empty()) other.method = o.method == "dense" ? "gdn" : "dense";
    else other.op = o.op == "attention" ? "simple_gla" : "attention";
    ProfilePlan q = profile_plan(other);
    for (const auto& s : stacks) EXPECT_FALSE(nvtx_stack_matches(s, q.range_path)) << what << " vs " << q.nvtx_include;
  };
  for (const MethodSpec* m : Registry::get().methods())
    for (const auto& phase : profile_phases()) {
      if (phase == "decode" && !m->has_decode()) continue;
      ProfileOptions o;
      o.method = m->name;
      o.phase = phase;
      // a looped method whose prelude and coda need 3 blocks runs at 3 (the preset's models have 2)
      try {
        m->config.parse(sweep_preset("cpu-tiny").config);
      } catch (const InputError&) {
        o.config = "n_layer=3";
      }
      check(o, m->name + " " + phase);
    }
  for (const OpSpec* op : Registry::get().ops()) {
    bool called = false;
    for (const MethodSpec* m : Registry::get().methods())
      for (const auto& n : m->ops) called = called || (n == op->name && !m->is_hybrid());
    if (!called) continue;
    const bool has_backward = std::any_of(op->inputs.begin(), op->inputs.end(), [](const TensorDef& d) { return d.differentiable; });
    if (!has_backward) {
      ProfileOptions o;
      o.op = op->name;
      o.phase = "backward";
      EXPECT_THROW(profile_plan(o), UsageError) << op->name << " has no differentiable input";
    }
    for (const char* phase : {"forward", "backward"}) {
      if (std::string(phase) == "backward" && !has_backward) continue;
      ProfileOptions o;
      o.op = op->name;
      o.phase = phase;
      check(o, op->name + " " + phase);
    }
  }
}

}  // namespace
}  // namespace mixbench
