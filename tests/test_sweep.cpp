// Tests of the throughput/OOM sweep and its HTML plot. Timing values are only checked to be
// positive and finite; every quantitative assertion is on the accountant's numbers.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <unistd.h>

#include "harness/args.h"
#include "harness/cli/cli.h"
#include "harness/cli/sweep_args.h"
#include "harness/decode_knobs.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/nvtx.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "reports/plot.h"
#include "suites/mfu.h"
#include "suites/sweep.h"
#include "suites/sweep_measure.h"
#include "suites/sweep_units.h"
#include "harness/backbone.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

fs::path sweep_tmp() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / fmt::format("mixbench_sweep_test_{}", ::getpid());
    fs::create_directories(p);
    return p;
  }();
  return d;
}

int cli(std::vector<std::string> args) { return run_cli(args); }

Json load(const fs::path& p) { return Json::parse(read_file(p.string())); }

void expect_valid(const Json& r) {
  auto errs = validate_json(r, report_schema());
  EXPECT_TRUE(errs.empty()) << (errs.empty() ? "" : errs[0]);
}

std::vector<Json> points(const Json& r, const std::string& method, int64_t B) {
  std::vector<Json> out;
  for (const auto& x : r["results"])
    if (x["method"] == method && x["shape"].contains("B") && x["shape"]["B"] == B) out.push_back(x);
  return out;
}

void expect_sane_ok_point(const Json& x) {
  ASSERT_EQ(x["status"], "ok") << x.dump();
  for (const char* k : {"median_s", "min_s", "max_s", "iqr_s"}) {
    const double v = x["timing"][k].get<double>();
    EXPECT_TRUE(std::isfinite(v) && v >= 0) << k << " " << v;
  }
  EXPECT_GT(x["timing"]["median_s"].get<double>(), 0);
  EXPECT_LE(x["timing"]["min_s"].get<double>(), x["timing"]["median_s"].get<double>());
  EXPECT_LE(x["timing"]["median_s"].get<double>(), x["timing"]["max_s"].get<double>());
  EXPECT_TRUE(std::isfinite(x["tokens_per_s"].get<double>()) && x["tokens_per_s"].get<double>() > 0);
  EXPECT_TRUE(std::isfinite(x["flop_per_s"].get<double>()) && x["flop_per_s"].get<double>() > 0);
  // MFU: the point's FLOP rate over the matmul rate this device sustains in the sweep's dtype (on a
  // loaded CPU the probe and the point see different loads, so only its presence and sign are checked)
  EXPECT_TRUE(std::isfinite(x["mfu"].get<double>()) && x["mfu"].get<double>() > 0);
  EXPECT_GT(x["accountant"]["predicted_bytes"].get<double>(), 0);
  EXPECT_GT(x["memory"]["peak_bytes"].get<int64_t>(), 0);
}

}  // namespace

TEST(Sweep, ParsesLengthsAndBytes) {
  EXPECT_EQ(parse_lengths("1k:8k"), (std::vector<int64_t>{1024, 2048, 4096, 8192}));
  EXPECT_EQ(parse_lengths("128:128"), (std::vector<int64_t>{128}));
  EXPECT_EQ(parse_lengths("512,256,256"), (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(parse_lengths("1m:1m"), (std::vector<int64_t>{1 << 20}));
  EXPECT_THROW(parse_lengths("5:1"), UsageError);
  EXPECT_THROW(parse_lengths("0:4"), UsageError);
  EXPECT_THROW(parse_lengths("a,b"), UsageError);
  EXPECT_THROW(parse_lengths(""), UsageError);
  EXPECT_EQ(parse_bytes("2G"), 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("1000"), 1000.0);
  EXPECT_THROW(parse_bytes("2X"), UsageError);
  EXPECT_THROW(sweep_preset("gpu-d13"), UsageError);
}

// The cpu-tiny preset end to end for the baseline, and the accountant's cost per token of full
// attention grows with T while the timings stay positive and finite.
TEST(Sweep, ParsesCountListsInOrder) {
  EXPECT_EQ(parse_counts("4,1k,2", "batch size"), (std::vector<int64_t>{4, 1024, 2}));
  EXPECT_EQ(parse_counts("2,2", "batch size"), (std::vector<int64_t>{2, 2}));
  EXPECT_THROW(parse_counts("", "batch size"), UsageError);
  EXPECT_THROW(parse_counts("1,0", "batch size"), UsageError);
  try {
    parse_counts("1,x", "batch size");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bad batch size 'x'"), std::string::npos) << e.what();
  }
}

namespace {
SweepOptions sweep_args(std::vector<std::string> v) {
  return sweep_options_from_args(Args(v, {"mode", "level", "batch", "lengths", "device", "dtype", "preset", "config",
                                          "reps", "warmup", "memory-limit", "out", "seed"},
                                      {"quiet"}, {"methods"}));
}
}  // namespace

TEST(Sweep, OptionsFromArgsApplyThePresetThenTheFlags) {
  SweepOptions o = sweep_args({"--mode", "train", "--methods", "dense,gdn", "--level", "layer", "--batch", "4,1",
                               "--lengths", "512,128", "--config", "d_model=64", "--reps", "5", "--warmup", "0",
                               "--memory-limit", "2G", "--seed", "7"});
  EXPECT_EQ(o.mode, "train");
  EXPECT_EQ(o.level, "layer");
  EXPECT_EQ(o.methods, (std::vector<std::string>{"dense", "gdn"}));
  EXPECT_EQ(o.batches, (std::vector<int64_t>{4, 1}));     // in the given order
  EXPECT_EQ(o.lengths, (std::vector<int64_t>{128, 512}));  // ascending
  EXPECT_EQ(o.preset, "cpu-tiny");
  EXPECT_EQ(o.config, "n_layer=2,d_model=128,head_dim=32,vocab=256,d_model=64");  // the preset's, then --config
  EXPECT_EQ(o.reps, 5);
  EXPECT_EQ(o.warmup, 0);
  EXPECT_EQ(o.memory_limit, 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.device, "cpu");
  EXPECT_EQ(o.dtype, "fp32");
  // the preset alone, every method
  testing::internal::CaptureStderr();
  SweepOptions p = sweep_args({"--mode", "prefill"});
  const std::string notes = testing::internal::GetCapturedStderr();
  EXPECT_EQ(p.batches, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(p.lengths, parse_lengths("128:2048"));
  // every method whose rules accept the preset's 2-layer models; the others are named in a note
  size_t refused = 0;
  for (auto* m : Registry::get().methods()) {
    const bool in = std::find(p.methods.begin(), p.methods.end(), m->name) != p.methods.end();
    try {
      m->config.parse(p.config);
      EXPECT_TRUE(in) << m->name;
    } catch (const InputError&) {
      ++refused;
      EXPECT_FALSE(in) << m->name;
      EXPECT_NE(notes.find("leaving out " + m->name + ":"), std::string::npos) << notes;
    }
  }
  EXPECT_EQ(p.methods.size() + refused, Registry::get().methods().size());
  // a refused method named explicitly is an error
  for (auto* m : Registry::get().methods()) {
    try {
      m->config.parse(p.config);
    } catch (const InputError&) {
      EXPECT_THROW(sweep_args({"--mode", "prefill", "--methods", m->name}), InputError) << m->name;
    }
  }
  // bad input names the problem
  auto usage = [](std::vector<std::string> v, const std::string& want) {
    try {
      sweep_args(v);
      ADD_FAILURE() << "no error for " << want;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  usage({"--methods", "dense"}, "sweep needs --mode");
  usage({"--mode", "decode", "--level", "layer"}, "--mode decode runs at model level");
  usage({"--mode", "prefill", "--device", "tpu"}, "unknown device 'tpu'");
  usage({"--mode", "prefill", "--reps", "0"}, "--reps must be >= 1");
  usage({"--mode", "prefill", "--level", "op", "--methods", "dense", "--config", "no_such_key=1"},
        "unknown config field 'no_such_key'");
}

TEST(Sweep, MethodConfigTakesTheOverridesAndTheLength) {
  const MethodSpec& m = Registry::get().method("dense");
  SweepOptions o = sweep_preset("cpu-tiny");
  Config c = sweep_method_config(m, o, 256);
  EXPECT_EQ(c.i("seq_len"), 256);
  EXPECT_EQ(c.i("n_layer"), 2);
  EXPECT_EQ(c.i("d_model"), 128);
  o.config = "n_layer=-3";
  EXPECT_THROW(sweep_method_config(m, o, 256), InputError);
}

TEST(Sweep, TimingStatisticsOfTheSamples) {
  Json t = sweep_detail::timing_json({3.0, 1.0, 2.0, 4.0}, 2);
  EXPECT_EQ(t["reps"], 4);
  EXPECT_EQ(t["warmup"], 2);
  EXPECT_DOUBLE_EQ(t["median_s"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(t["min_s"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(t["max_s"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(t["iqr_s"].get<double>(), 3.25 - 1.75);
  EXPECT_EQ(t["samples_s"], Json({3.0, 1.0, 2.0, 4.0}));  // in the order measured
  // a CPU memory probe sees an allocation it spans
  sweep_detail::MemProbe probe{"cpu"};
  probe.start();
  std::vector<char> block(64 << 20, 1);
  Json mem = probe.finish();
  EXPECT_EQ(mem["source"], "vmhwm");
  EXPECT_GT(mem["peak_bytes"].get<int64_t>(), int64_t(64) << 20);
  if (mem["peak_reset"].get<bool>()) EXPECT_GE(mem["delta_bytes"].get<int64_t>(), int64_t(60) << 20);
  EXPECT_EQ(block[12345], 1);
  EXPECT_EQ(sweep_detail::fmt_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(sweep_detail::fmt_bytes(12.0 * 1024 * 1024), "12.0 MiB");
  EXPECT_TRUE(sweep_detail::is_oom_message("CUDA out of memory. Tried to allocate 2 GiB"));
  EXPECT_FALSE(sweep_detail::is_oom_message("shape mismatch"));
}

TEST(Sweep, CpuTinyPresetPrefillRunsAndValidates) {
  fs::path out = sweep_tmp() / "tiny_prefill.json";
  ASSERT_EQ(cli({"sweep", "--mode", "prefill", "--methods", "dense_full", "--preset", "cpu-tiny", "--quiet", "--out",
                 out.string()}),
            0);
  Json r = load(out);
  expect_valid(r);
  EXPECT_EQ(r["kind"], "sweep");
  EXPECT_EQ(r["config"]["lengths"], Json({128, 256, 512, 1024, 2048}));
  for (int64_t B : {1, 2}) {
    auto pts = points(r, "dense_full", B);
    ASSERT_EQ(pts.size(), 5u) << "B=" << B;
    for (const auto& x : pts) {
      expect_sane_ok_point(x);
      EXPECT_EQ(x["memory"]["source"], "vmhwm");
      EXPECT_EQ(x["shape"]["d_model"], 128);
      EXPECT_EQ(x["config"]["seq_len"], x["shape"]["T"]);
    }
    const double f128 = pts.front()["accountant"]["fwd_flops_per_token"].get<double>();
    const double f2048 = pts.back()["accountant"]["fwd_flops_per_token"].get<double>();
    EXPECT_EQ(pts.front()["shape"]["T"], 128);
    EXPECT_EQ(pts.back()["shape"]["T"], 2048);
    EXPECT_GT(f2048, 1.5 * f128);  // attention pairs per token grow ~T/2
    for (size_t i = 1; i < pts.size(); ++i)
      EXPECT_GT(pts[i]["accountant"]["fwd_flops_per_token"].get<double>(),
                pts[i - 1]["accountant"]["fwd_flops_per_token"].get<double>());
  }
}

TEST(Sweep, EveryMethodTrainsAtEveryLevel) {
  // The preset's 2-layer models: a looped method whose prelude and coda leave no core block at
  // 2 layers refuses the config (exit 2 on its own); those run at 3 layers.
  const SweepOptions preset = sweep_preset("cpu-tiny");
  std::vector<std::string> fits, deeper;
  for (auto* m : Registry::get().methods()) {
    try {
      m->config.parse(preset.config);
      fits.push_back(m->name);
    } catch (const InputError& e) {
      EXPECT_TRUE(bool(m->plan)) << m->name << " refuses the sweep's models: " << e.what();
      EXPECT_NE(std::string(e.what()).find("core"), std::string::npos) << e.what();
      deeper.push_back(m->name);
    }
  }
  EXPECT_LE(deeper.size(), 4u) << "only looped methods with a fixed prelude and coda (ut_act, huginn, ouro, mor)";
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  };
  for (const char* level : {"model", "layer", "op"}) {
    fs::path out = sweep_tmp() / fmt::format("train_{}.json", level);
    sweep_detail::reset_models_held_peak();
    ASSERT_EQ(cli({"sweep", "--mode", "train", "--methods", join(fits), "--level", level, "--lengths", "64,128",
                   "--batch", "1", "--reps", "1", "--warmup", "0", "--quiet", "--out", out.string()}),
              0)
        << level;
    // one model at a time: each method's goes before the next is built
    EXPECT_EQ(sweep_detail::models_held_peak(), std::string(level) == "model" ? 1 : 0) << level;
    EXPECT_EQ(sweep_detail::models_held(), 0) << level;
    if (!deeper.empty()) {
      fs::path out3 = sweep_tmp() / fmt::format("train3_{}.json", level);
      ASSERT_EQ(cli({"sweep", "--mode", "train", "--methods", join(deeper), "--level", level, "--lengths", "64",
                     "--batch", "1", "--reps", "1", "--warmup", "0", "--config", "n_layer=3", "--quiet", "--out",
                     out3.string()}),
                0)
          << level;
      Json r3 = load(out3);
      for (const auto& x : r3["results"]) EXPECT_EQ(x["status"], "ok") << x.dump();
    }
    Json r = load(out);
    expect_valid(r);
    EXPECT_NE(r["config"]["optimizer"].get<std::string>().find("until Muon lands"), std::string::npos);
    std::set<std::string> seen;
    for (const auto& x : r["results"]) {
      EXPECT_EQ(x["level"], level);
      EXPECT_EQ(x["mode"], "train");
      if (std::string(level) == "op") {
        ASSERT_EQ(x["status"], "ok") << x.dump();
        EXPECT_TRUE(x["op"].is_string());
        EXPECT_TRUE(x["flop_per_s"].is_null());  // ops declare no accountant
        continue;
      }
      expect_sane_ok_point(x);
      seen.insert(x["method"].get<std::string>());
      const auto& a = x["accountant"];
      EXPECT_DOUBLE_EQ(a["flops_per_token"].get<double>(), 3.0 * a["fwd_flops_per_token"].get<double>());
      EXPECT_DOUBLE_EQ(a["flops_per_step"].get<double>(),
                       a["flops_per_token"].get<double>() * x["shape"]["T"].get<double>());
    }
    if (std::string(level) != "op") EXPECT_EQ(seen.size(), fits.size()) << level;
  }
}

TEST(Sweep, MemoryLimitRecordsOomAndContinuesWithNextBatch) {
  // Predicted bytes grow with B·T; a limit at (B=1, T=256) lets B=1 fit up to 256 and B=2 up to 128.
  fs::path probe = sweep_tmp() / "oom_probe.json";
  ASSERT_EQ(cli({"sweep", "--mode", "train", "--methods", "gqa", "--lengths", "128:256", "--batch", "1", "--reps", "1",
                 "--warmup", "0", "--quiet", "--out", probe.string()}),
            0);
  const double limit = points(load(probe), "gqa", 1).back()["accountant"]["predicted_bytes"].get<double>();
  fs::path out = sweep_tmp() / "oom.json";
  ASSERT_EQ(cli({"sweep", "--mode", "train", "--methods", "gqa", "--lengths", "128:1024", "--batch", "1,2,4", "--reps",
                 "1", "--warmup", "0", "--quiet", "--memory-limit", fmt::format("{}", int64_t(std::ceil(limit))), "--out",
                 out.string()}),
            0);
  Json r = load(out);
  expect_valid(r);
  EXPECT_EQ(r["summary"]["oom"], 3);
  const std::map<int64_t, Json> expect_last = {{1, 256}, {2, 128}, {4, nullptr}};
  for (const auto& [B, last] : expect_last) {
    auto pts = points(r, "gqa", B);
    ASSERT_FALSE(pts.empty()) << "the sweep did not continue with B=" << B;
    const Json& o = pts.back();
    EXPECT_EQ(o["status"], "oom");
    EXPECT_EQ(o["reason"], "memory limit");
    EXPECT_EQ(o["last_fit_T"], last) << "B=" << B;
    EXPECT_GT(o["accountant"]["predicted_bytes"].get<double>(), limit);
    for (size_t i = 0; i + 1 < pts.size(); ++i) EXPECT_EQ(pts[i]["status"], "ok");
  }
  // The plot marks the frontier.
  fs::path html = sweep_tmp() / "oom.html";
  ASSERT_EQ(cli({"plot", out.string(), "--out", html.string()}), 0);
  const std::string page = read_file(html.string());
  std::regex oom_re(R"(<g class="oom")");
  EXPECT_EQ(std::distance(std::sregex_iterator(page.begin(), page.end(), oom_re), std::sregex_iterator()), 3);
}

TEST(Sweep, DecodeReportsCacheGrowthFromTheAccountant) {
  fs::path out = sweep_tmp() / "decode.json";
  sweep_detail::reset_models_held_peak();
  ASSERT_EQ(cli({"sweep", "--mode", "decode", "--methods", "dense_full,gqa,gdn,lightning", "--preset", "cpu-tiny",
                 "--lengths", "64,128", "--batch", "1,2", "--reps", "2", "--warmup", "1", "--quiet", "--out",
                 out.string()}),
            0);
  // each method's model (and its caches) goes before the next one's is built
  EXPECT_EQ(sweep_detail::models_held_peak(), 1);
  EXPECT_EQ(sweep_detail::models_held(), 0);
  Json r = load(out);
  expect_valid(r);
  EXPECT_EQ(r["config"]["mode"], "decode");
  for (const std::string m : {"dense_full", "gqa", "gdn", "lightning"}) {
    for (int64_t B : {1, 2}) {
      auto pts = points(r, m, B);
      ASSERT_EQ(pts.size(), 2u) << m;
      for (const auto& x : pts) {
        expect_sane_ok_point(x);
        EXPECT_EQ(x["mode"], "decode");
        EXPECT_EQ(x["accountant"]["context"], x["shape"]["T"]);
        EXPECT_DOUBLE_EQ(x["latency_per_token_s"].get<double>(), x["timing"]["median_s"].get<double>());
        EXPECT_DOUBLE_EQ(x["tokens_per_s"].get<double>(), double(B) / x["timing"]["median_s"].get<double>());
        // fp32 caches hold exactly what the accountant predicts (K/V per token, or state + conv tails)
        EXPECT_EQ(x["cache"]["context_after_prefill"], x["shape"]["T"]);
        EXPECT_DOUBLE_EQ(double(x["cache"]["bytes_after_prefill"].get<int64_t>()),
                         x["accountant"]["cache_bytes"].get<double>())
            << m;
        // warm-up + reps decode steps after the prefill
        EXPECT_EQ(x["cache"]["context_at_end"].get<int64_t>(), x["shape"]["T"].get<int64_t>() + 3);
        // on the CPU the step runs eagerly and says why
        EXPECT_EQ(x["cache"]["cuda_graph"], false) << m;
        EXPECT_EQ(x["cache"]["cuda_graph_note"], "CUDA graphs run on CUDA only") << m;
        // roofline: the step's reads over its median time, against the report's copy bandwidth
        const Json& rf = x["roofline"];
        for (const char* k : {"bytes", "weight_bytes", "embedding_row_bytes", "cache_bytes", "copy_bytes_per_s", "share"})
          EXPECT_TRUE(std::isfinite(rf[k].get<double>()) && rf[k].get<double>() > 0) << m << " " << k;
        EXPECT_DOUBLE_EQ(rf["cache_bytes"].get<double>(), x["accountant"]["cache_bytes"].get<double>());
        EXPECT_DOUBLE_EQ(rf["bytes"].get<double>(), rf["weight_bytes"].get<double>() +
                                                        rf["embedding_row_bytes"].get<double>() +
                                                        rf["cache_bytes"].get<double>());
        EXPECT_DOUBLE_EQ(rf["copy_bytes_per_s"].get<double>(), r["copy_bandwidth"]["bytes_per_s"].get<double>());
        EXPECT_NEAR(rf["share"].get<double>(),
                    rf["bytes"].get<double>() / x["timing"]["median_s"].get<double>() / rf["copy_bytes_per_s"].get<double>(),
                    1e-12 * rf["share"].get<double>());
        // the weights once plus one row per embedding table and token: with the tables whole, the
        // accountant's fp32 parameter bytes (its prediction less the cache and the fp32 logits)
        const double vocab = x["shape"]["vocab"].get<double>();
        EXPECT_DOUBLE_EQ(rf["weight_bytes"].get<double>() + rf["embedding_row_bytes"].get<double>() * vocab / double(B),
                         x["accountant"]["predicted_bytes"].get<double>() - x["accountant"]["cache_bytes"].get<double>() -
                             4.0 * vocab * double(B))
            << m;
        EXPECT_EQ(rf["embedding_row_bytes"].get<double>(), double(B) * points(r, m, 1)[0]["roofline"]["embedding_row_bytes"].get<double>());
      }
      const Json &a = pts[0], &b = pts[1];
      ASSERT_EQ(a["shape"]["T"], 64);
      ASSERT_EQ(b["shape"]["T"], 128);
      const double ca = a["accountant"]["cache_bytes"], cb = b["accountant"]["cache_bytes"];
      const double fa = a["accountant"]["decode_flops_per_token"], fb = b["accountant"]["decode_flops_per_token"];
      const int64_t ea = a["cache"]["bytes_at_end"], eb = b["cache"]["bytes_at_end"];
      if (m == "dense_full" || m == "gqa") {
        EXPECT_DOUBLE_EQ(cb, 2.0 * ca) << m;  // KV cache grows linearly with the context
        EXPECT_GT(fb, fa) << m;
        EXPECT_GT(ea, int64_t(a["cache"]["bytes_after_prefill"])) << m;  // and with every decoded token
      } else {
        EXPECT_DOUBLE_EQ(cb, ca) << m;  // fixed recurrent state
        EXPECT_GT(ca, 0) << m;
        EXPECT_DOUBLE_EQ(fb, fa) << m;
        EXPECT_EQ(ea, eb) << m;
        EXPECT_EQ(ea, int64_t(a["cache"]["bytes_after_prefill"])) << m;
      }
    }
  }
  // B = 2 holds twice the cache of B = 1; gqa's KV cache is half of dense_full's
  EXPECT_DOUBLE_EQ(points(r, "gdn", 2)[0]["accountant"]["cache_bytes"].get<double>(),
                   2.0 * points(r, "gdn", 1)[0]["accountant"]["cache_bytes"].get<double>());
  EXPECT_DOUBLE_EQ(points(r, "gqa", 1)[1]["accountant"]["cache_bytes"].get<double>(),
                   0.5 * points(r, "dense_full", 1)[1]["accountant"]["cache_bytes"].get<double>());
  // the copy bandwidth is measured once and recorded once
  EXPECT_EQ(r["copy_bandwidth"]["device"], "cpu");
  EXPECT_GT(r["copy_bandwidth"]["bytes_per_s"].get<double>(), 0);
  EXPECT_EQ(r["copy_bandwidth"]["bytes_per_s"].get<double>(), copy_bandwidth("cpu").bytes_per_s);
  // the schema wants a roofline's share and bandwidth, both positive (decode reports written before
  // the roofline existed have none and stay valid)
  Json bad = r;
  bad["results"][0].erase("roofline");
  EXPECT_TRUE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"][0]["roofline"]["share"] = 0.0;
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"][0]["roofline"].erase("copy_bytes_per_s");
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["copy_bandwidth"]["bytes_per_s"] = -1.0;
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  // a captured point (CUDA) records the decode kernels' settings beside its cache: the schema takes
  // every field decode_knobs_json writes and refuses values outside them
  Json captured = r;
  captured["results"][0]["cache"].update(decode_knobs_json());
  captured["results"][0]["cache"]["cuda_graph"] = true;
  captured["results"][0]["cache"].erase("cuda_graph_note");
  EXPECT_EQ(validate_json(captured, report_schema()), std::vector<std::string>{});
  EXPECT_EQ(captured["results"][0]["cache"].size(), r["results"][0]["cache"].size() - 1 + 5);
  bad = captured;
  bad["results"][0]["cache"]["split_by"] = "heads";
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  EXPECT_EQ(cli({"sweep", "--mode", "decode", "--methods", "gqa", "--level", "layer", "--quiet"}), 2);
}

// A decode point's roofline share: the bytes one step reads over its median time, as a share of the
// copy bandwidth (numbers chosen by hand).
TEST(Sweep, RooflineShareArithmetic) {
  // 3 MB of weights, 24 kB of embedding rows and 1 MB of cache in 2 ms against 4 GB/s: 0.503 of the roofline
  const Json rf = roofline_json(3e6, 24e3, 1e6, 2e-3, 4e9);
  EXPECT_DOUBLE_EQ(rf["bytes"].get<double>(), 4.024e6);
  EXPECT_DOUBLE_EQ(rf["share"].get<double>(), 4.024e6 / 2e-3 / 4e9);
  EXPECT_NEAR(rf["share"].get<double>(), 0.503, 1e-12);
  EXPECT_DOUBLE_EQ(rf["copy_bytes_per_s"].get<double>(), 4e9);
  EXPECT_DOUBLE_EQ(roofline_share(1e9, 0.5, 1e9), 2.0);  // above the copy rate: reported as measured
  EXPECT_EQ(roofline_share(1e9, 0, 1e9), 0);              // missing time or bandwidth: 0, never inf
  EXPECT_EQ(roofline_share(1e9, 1, 0), 0);
  EXPECT_EQ(roofline_share(0, 1, 1e9), 0);
  const CopyBandwidth& b = copy_bandwidth("cpu");
  EXPECT_EQ(&copy_bandwidth("cpu"), &b);  // measured once per process
  EXPECT_EQ(b.bytes, int64_t(256) << 20);
  EXPECT_TRUE(std::isfinite(b.bytes_per_s) && b.bytes_per_s > 0);
}

TEST(Sweep, ReportInProgressAfterEveryPointAndResume) {
  // run_sweep hands every point to the progress callback as it is pushed, in order
  SweepOptions opt = sweep_preset("cpu-tiny");
  opt.mode = "prefill";
  opt.methods = {"dense_full"};
  opt.lengths = {64, 128};
  opt.batches = {1, 2};
  opt.reps = 1;
  opt.warmup = 0;
  opt.progress = false;
  std::vector<size_t> seen;
  SweepSummary sum;
  Json res = run_sweep(opt, sum, [&](const Json& r, const SweepSummary& s) {
    seen.push_back(r.size());
    EXPECT_EQ(size_t(s.ok + s.oom + s.skipped + s.errors), r.size());
  });
  EXPECT_EQ(seen, (std::vector<size_t>{1, 2, 3, 4}));
  EXPECT_EQ(sum.kept, 0);

  // A sweep with an OOM frontier (B=1 fits 128, B=2 only 64), then cut to its first points as a
  // stopped run leaves it: --resume keeps them as they were and measures the rest.
  const std::vector<std::string> probe_args = {"sweep", "--mode", "train", "--methods", "gqa", "--lengths", "64:128",
                                               "--batch", "1", "--reps", "1", "--warmup", "0", "--quiet"};
  fs::path probe = sweep_tmp() / "resume_probe.json";
  auto pa = probe_args;
  pa.insert(pa.end(), {"--out", probe.string()});
  ASSERT_EQ(cli(pa), 0);
  const double limit = points(load(probe), "gqa", 1).back()["accountant"]["predicted_bytes"].get<double>();
  const std::vector<std::string> args = {"sweep", "--mode", "train", "--methods", "gqa", "--lengths", "64:256", "--batch",
                                         "1,2", "--reps", "1", "--warmup", "0", "--quiet", "--memory-limit",
                                         fmt::format("{}", int64_t(std::ceil(limit)))};
  fs::path out = sweep_tmp() / "resume.json";
  fs::remove(out);
  auto full_args = args;
  full_args.insert(full_args.end(), {"--out", out.string(), "--resume"});  // no report yet: a fresh sweep
  ASSERT_EQ(cli(full_args), 0);
  const Json full = load(out);
  expect_valid(full);
  EXPECT_EQ(full["summary"]["complete"], true);
  EXPECT_EQ(full["summary"]["kept"], 0);
  EXPECT_FALSE(full["summary"].contains("resumed_from"));
  const size_t n = full["results"].size();
  ASSERT_GE(n, 4u);
  EXPECT_EQ(full["summary"]["oom"], 2);  // a frontier at each batch size
  EXPECT_EQ(full["results"][n - 1]["status"], "oom");
  EXPECT_EQ(points(full, "gqa", 1).back()["status"], "oom");

  // stopped with B=2's last point errored (it runs again); the first point marked to tell it was kept
  Json cut = full;
  Json errored = full["results"][n - 1];
  errored["status"] = "error";
  errored["message"] = "a failure of the earlier run";
  cut["results"][n - 1] = errored;
  cut["results"][0]["timing"]["median_s"] = 123.0;
  cut["summary"]["complete"] = false;
  cut["git_commit"] = "0123abc";
  write_file_atomic(out.string(), cut.dump());
  ASSERT_EQ(cli(full_args), 0);
  const Json resumed = load(out);
  expect_valid(resumed);
  EXPECT_EQ(resumed["summary"]["complete"], true);
  EXPECT_EQ(resumed["summary"]["kept"], int(n - 1));
  EXPECT_EQ(resumed["summary"]["ok"], full["summary"]["ok"]);
  EXPECT_EQ(resumed["summary"]["oom"], full["summary"]["oom"]);
  ASSERT_EQ(resumed["summary"]["resumed_from"].size(), 1u);
  EXPECT_EQ(resumed["summary"]["resumed_from"][0]["git_commit"], "0123abc");
  ASSERT_EQ(resumed["results"].size(), n);
  EXPECT_EQ(resumed["results"][0]["timing"]["median_s"], 123.0);  // kept, not measured again
  for (size_t i = 1; i + 1 < n; ++i) EXPECT_EQ(resumed["results"][i], full["results"][i]) << i;
  EXPECT_EQ(resumed["results"][n - 1]["status"], "oom");  // the errored point ran again
  EXPECT_EQ(resumed["results"][n - 1]["shape"]["T"], full["results"][n - 1]["shape"]["T"]);

  // a kept OOM point stops its batch size as a measured one does: resuming the complete report
  // measures nothing
  ASSERT_EQ(cli(full_args), 0);
  EXPECT_EQ(load(out)["summary"]["kept"], int(n));
  EXPECT_EQ(load(out)["results"], resumed["results"]);

  // the page says a report is in progress, and which runs a resumed one kept points from
  fs::path page = sweep_tmp() / "resume.html";
  write_file_atomic(out.string(), cut.dump());
  ASSERT_EQ(cli({"plot", out.string(), "--out", page.string()}), 0);
  EXPECT_NE(read_file(page.string()).find(fmt::format("in progress: {} points so far", n)), std::string::npos);
  ASSERT_EQ(cli(full_args), 0);
  ASSERT_EQ(cli({"plot", out.string(), "--out", page.string()}), 0);
  EXPECT_EQ(read_file(page.string()).find("in progress"), std::string::npos);
  EXPECT_NE(read_file(page.string()).find(fmt::format("{} points kept from earlier runs: 0123abc", n - 1)), std::string::npos);

  // a report of another sweep, a file that is not JSON, or --resume without --out: exit 2, the file untouched
  auto other = args;
  other[6] = "64:512";
  other.insert(other.end(), {"--out", out.string(), "--resume"});
  const std::string before = read_file(out.string());
  EXPECT_EQ(cli(other), 2);
  EXPECT_EQ(read_file(out.string()), before);
  fs::path bad = sweep_tmp() / "resume_bad.json";
  write_file_atomic(bad.string(), "{\"kind\": \"sweep\", ");
  auto bad_args = args;
  bad_args.insert(bad_args.end(), {"--out", bad.string(), "--resume"});
  EXPECT_EQ(cli(bad_args), 2);
  auto no_out = args;
  no_out.push_back("--resume");
  EXPECT_EQ(cli(no_out), 2);
}

TEST(Sweep, BadInputExitsTwo) {
  EXPECT_EQ(cli({"sweep", "--mode", "sideways", "--methods", "dense"}), 2);
  EXPECT_EQ(cli({"sweep", "--methods", "dense"}), 2);  // no mode
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--lengths", "5:1"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--methods", "dense_ful"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--level", "block"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--batch", "0"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--preset", "tpu"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--memory-limit", "lots"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--config", "n_layer=-3"}), 2);
  EXPECT_EQ(cli({"sweep", "--mode", "prefill", "--dtype", "fp8"}), 2);
  EXPECT_EQ(cli({"plot", "/nonexistent/report.json", "--out", (sweep_tmp() / "x.html").string()}), 2);
}

TEST(Sweep, NvtxRangesNamePointAndPhase) {
  NvtxRange::start_recording();
  ASSERT_EQ(cli({"sweep", "--mode", "train", "--methods", "dense", "--lengths", "64", "--batch", "2", "--reps", "1",
                 "--warmup", "1", "--quiet"}),
            0);
  auto names = NvtxRange::stop_recording();
  std::set<std::string> s(names.begin(), names.end());
  for (const char* n : {"dense.sweep.train.B2T64", "dense.sweep.train.B2T64.warmup", "dense.sweep.train.B2T64.timed",
                        "dense.sweep.train.B2T64.forward", "dense.sweep.train.B2T64.backward",
                        "dense.sweep.train.B2T64.update"})
    EXPECT_TRUE(s.count(n)) << n;
}

TEST(Sweep, PlotHasOneSvgPathPerMethodAndSchemaCatchesBreakage) {
  fs::path out = sweep_tmp() / "plot.json";
  ASSERT_EQ(cli({"sweep", "--mode", "prefill", "--methods", "dense_full,mqa,gqa", "--lengths", "64:256", "--batch", "1",
                 "--reps", "1", "--warmup", "0", "--quiet", "--out", out.string()}),
            0);
  fs::path html = sweep_tmp() / "plot.html";
  ASSERT_EQ(cli({"plot", out.string(), "--out", html.string()}), 0);
  const std::string page = read_file(html.string());
  EXPECT_NE(page.find("<svg"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  std::regex path_re(R"~(<path class="series" data-method="([a-z_]+)")~");
  std::multiset<std::string> methods;
  for (auto it = std::sregex_iterator(page.begin(), page.end(), path_re); it != std::sregex_iterator(); ++it)
    methods.insert((*it)[1]);
  EXPECT_EQ(methods, (std::multiset<std::string>{"dense_full", "gqa", "mqa"}));

  // The schema rejects broken sweep points.
  Json r = load(out);
  expect_valid(r);
  Json bad = r;
  bad["results"][0].erase("timing");
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"][0]["status"] = "pass";
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"][0]["timing"]["median_s"] = -1.0;
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"][0]["memory"].erase("peak_bytes");
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad = r;
  bad["results"][0]["status"] = "oom";  // an oom point needs its reason and last fitting length
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  // A missing report is bad input.
  EXPECT_EQ(cli({"plot", (sweep_tmp() / "nonexistent.json").string(), "--out", html.string()}), 2);
}

// A method with its own residual stream is timed a second time inside its family control's stream
// (same sublayers, same parameters); the point reports the stream's FLOP and time shares.
TEST(Sweep, ResidualStreamShareBesideItsControl) {
  fs::path out = sweep_tmp() / "stream_share.json";
  ASSERT_EQ(cli({"sweep", "--mode", "train", "--methods", "hc,mhc,attnres,residual_standard,dense_full", "--lengths",
                 "32", "--batch", "1", "--reps", "2", "--warmup", "0", "--config", "d_model=32,head_dim=16,vocab=64",
                 "--quiet", "--out", out.string()}),
            0);
  Json r = load(out);
  expect_valid(r);
  const std::map<std::string, std::string> stream_of = {{"hc", "hc"}, {"mhc", "mhc"}, {"attnres", "attnres"}};
  int seen = 0;
  for (const auto& x : r["results"]) {
    const std::string m = x["method"];
    ASSERT_EQ(x["status"], "ok") << x.dump();
    if (!stream_of.count(m)) {
      EXPECT_FALSE(x.contains("residual_stream")) << m << ": the control and nanochat's stream have no share";
      continue;
    }
    ++seen;
    ASSERT_TRUE(x.contains("residual_stream")) << m;
    const Json& s = x["residual_stream"];
    EXPECT_EQ(s["stream"], stream_of.at(m));
    EXPECT_EQ(s["control_stream"], "standard");
    EXPECT_GT(s["control_timing"]["median_s"].get<double>(), 0);
    EXPECT_NEAR(s["time_share"].get<double>(),
                1.0 - s["control_timing"]["median_s"].get<double>() / x["timing"]["median_s"].get<double>(), 1e-12);
    // the FLOP share from the stream's own arithmetic and its matmul parameters
    const MethodSpec& spec = Registry::get().method(m);
    const Config cfg = sweep_method_config(spec, sweep_args({"--mode", "train", "--config", "d_model=32,head_dim=16,vocab=64"}), 32);
    const auto stream = model_stream(spec, cfg);
    const ModelDims d = model_dims(cfg);
    const ExecPlan plan = model_plan(spec, cfg);
    double f = stream->fwd_flops(d, plan);
    for (const ParamDef& p : stream->params(d, plan))
      if (p.matmul) f += 2.0 * double(c10::multiply_integers(p.shape));
    CostQuery q;
    q.T = q.context = 32;
    q.dtype_bytes = 4;
    const double share = f / account_model(spec, cfg, q).fwd_flops;
    EXPECT_GT(share, 0) << m;
    EXPECT_LT(share, 1) << m;
    EXPECT_NEAR(s["flop_share"].get<double>(), share, 1e-12 * share) << m;
  }
  EXPECT_EQ(seen, 3);
}

// The control model runs the same sublayers and parameters inside the control's stream: the
// method's stream parameters do not reach its loss, while they change the method's own.
TEST(Sweep, StreamControlModelIgnoresTheStreamParameters) {
  const MethodSpec& hc = Registry::get().method("hc");
  const Config cfg = sweep_method_config(hc, sweep_args({"--mode", "train", "--config", "d_model=32,head_dim=16,vocab=64"}), 16);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  Model m = build_model(hc, cfg, gen, at::TensorOptions().dtype(at::kDouble), /*random_nonzero=*/true);
  std::optional<Model> c = sweep_detail::control_model(m);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->stream->name(), "standard");
  EXPECT_EQ(m.stream->name(), "hc");
  at::Tensor idx = at::randint(m.dims.vocab, {1, 16}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor tgt = at::randint(m.dims.vocab, {1, 16}, gen, at::TensorOptions().dtype(at::kLong));
  c10::NoGradGuard ng;
  const double own = model_loss(m, idx, tgt, Backend::CPU).item<double>();
  const double ctl = model_loss(*c, idx, tgt, Backend::CPU).item<double>();
  EXPECT_NE(own, ctl);
  for (auto& [n, p] : m.params)
    if (n.rfind("hc.", 0) == 0) p.mul_(3.0).add_(0.5);  // shared tensors: both models see it
  EXPECT_NE(model_loss(m, idx, tgt, Backend::CPU).item<double>(), own);
  EXPECT_EQ(model_loss(*c, idx, tgt, Backend::CPU).item<double>(), ctl);
  // nanochat's stream and the control itself have no control model
  EXPECT_FALSE(sweep_detail::control_model(build_model(Registry::get().method("dense_full"), cfg, gen,
                                                       at::TensorOptions().dtype(at::kDouble)))
                   .has_value());
  EXPECT_FALSE(sweep_detail::control_model(build_model(Registry::get().method("residual_standard"), cfg, gen,
                                                       at::TensorOptions().dtype(at::kDouble)))
                   .has_value());
}

namespace {
// A hand-made sweep report: methods a, b, c at B = 1 and 4, T = 128…512; decode points carry a roofline share.
Json small_multiples_report(const std::string& mode) {
  Json r = {{"kind", "sweep"}, {"command", "mixbench sweep"}, {"config", {{"mode", mode}, {"level", "model"}}},
            {"results", Json::array()}};
  if (mode == "decode")
    r["copy_bandwidth"] = {{"device", "cpu"}, {"device_name", "Test CPU"}, {"bytes", 1}, {"reps", 1}, {"bytes_per_s", 2.5e10}};
  int i = 0;
  for (int64_t B : {1, 4})
    for (const char* m : {"a", "b", "c"})
      for (int64_t T : {128, 256, 512}) {
        Json x = {{"method", m}, {"status", "ok"}, {"shape", {{"B", B}, {"T", T}}}, {"tokens_per_s", 1000.0 * (++i)}};
        if (mode == "decode") x["roofline"] = {{"share", 0.1 * double(i % 10)}};
        r["results"].push_back(x);
      }
  return r;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// the legend rows' y positions, panel by panel
std::vector<std::vector<double>> legend_rows(const std::string& page) {
  std::vector<std::vector<double>> out;
  std::regex re(R"~(<g class="panel"|<text class="legend" x="[0-9.]+" y="([0-9.]+)")~");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), re); it != std::sregex_iterator(); ++it) {
    if ((*it)[1].matched) out.back().push_back(std::stod((*it)[1]));
    else out.emplace_back();
  }
  return out;
}
}  // namespace

// One throughput panel per batch size, each with its own legend of the three methods; every method
// keeps one colour and one dash pattern, different from the others'; no roofline panel outside decode.
TEST(Plot, SmallMultiplesOnePanelPerBatchSize) {
  const std::string page = render_sweep_html(small_multiples_report("prefill"));
  EXPECT_EQ(count(page, "<g class=\"panel\""), 2);
  EXPECT_EQ(count(page, R"(<g class="panel" data-panel="throughput" data-batch="1">)"), 1);
  EXPECT_EQ(count(page, R"(<g class="panel" data-panel="throughput" data-batch="4">)"), 1);
  EXPECT_EQ(count(page, "data-panel=\"roofline\""), 0);
  EXPECT_EQ(count(page, "class=\"roofline\""), 0);
  EXPECT_EQ(count(page, "<text class=\"panel-title\""), 2);
  EXPECT_NE(page.find("prefill throughput, B = 1"), std::string::npos);
  EXPECT_NE(page.find("prefill throughput, B = 4"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(count(page, "<path class=\"series\""), 6);
  // each method's stroke: the same in both panels, distinct from the other methods'
  std::regex re(R"~(<path class="series" data-method="([a-z]+)" data-batch="([0-9]+)" d="[^"]*" fill="none" stroke="([^"]+)" stroke-width="2"( stroke-dasharray="[^"]*")?/>)~");
  std::map<std::string, std::set<std::string>> style;
  for (auto it = std::sregex_iterator(page.begin(), page.end(), re); it != std::sregex_iterator(); ++it)
    style[(*it)[1]].insert(std::string((*it)[3]) + "|" + std::string((*it)[4]));
  ASSERT_EQ(style.size(), 3u);
  std::set<std::string> colours, dashes;
  for (const auto& [m, st] : style) {
    ASSERT_EQ(st.size(), 1u) << m;
    colours.insert(st.begin()->substr(0, st.begin()->find('|')));
    dashes.insert(st.begin()->substr(st.begin()->find('|')));
  }
  EXPECT_EQ(colours.size(), 3u);
  EXPECT_EQ(dashes.size(), 3u);
  // a legend per panel, three rows, far enough apart for 12 px text
  auto rows = legend_rows(page);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& p : rows) {
    ASSERT_EQ(p.size(), 3u);
    for (size_t i = 1; i < p.size(); ++i) EXPECT_GE(p[i] - p[i - 1], 14.0);
  }
}

// A decode sweep adds a roofline panel under each throughput panel: the share of every point, in percent.
TEST(Plot, DecodeSweepHasARooflinePanelPerBatchSize) {
  Json r = small_multiples_report("decode");
  const std::string page = render_sweep_html(r);
  EXPECT_EQ(count(page, "<g class=\"panel\""), 4);
  EXPECT_EQ(count(page, "data-panel=\"throughput\""), 2);
  EXPECT_EQ(count(page, R"(<g class="panel" data-panel="roofline" data-batch="1">)"), 1);
  EXPECT_EQ(count(page, R"(<g class="panel" data-panel="roofline" data-batch="4">)"), 1);
  EXPECT_EQ(count(page, "<path class=\"roofline\""), 6);
  EXPECT_EQ(count(page, "<text class=\"panel-title\""), 4);
  EXPECT_NE(page.find("100 %"), std::string::npos);
  EXPECT_NE(page.find("a B=1 c=128: 10.0 % of the copy bandwidth"), std::string::npos);
  EXPECT_NE(page.find("25.00 GB/s on Test CPU"), std::string::npos);
  for (const auto& p : legend_rows(page)) EXPECT_EQ(p.size(), 3u);
  // a share above 1 extends the axis to the next quarter instead of leaving the panel
  r["results"][0]["roofline"]["share"] = 1.1;
  const std::string high = render_sweep_html(r);
  EXPECT_NE(high.find("125 %"), std::string::npos);
  EXPECT_EQ(page.find("125 %"), std::string::npos);
}
