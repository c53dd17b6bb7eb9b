// Tests of a leaderboard trained in parts and combined (leaderboard --from, --no-train): parts of
// other methods and seeds give the same rows as one run of them all, a combine trains nothing,
// cells no part holds are listed as missing, and bad parts (missing, not JSON, other options, a
// cell twice with different values) are refused naming the file.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <unistd.h>

#include "harness/cli/cli.h"
#include "harness/io.h"
#include "harness/report.h"
#include "harness/errors.h"
#include "suites/leaderboard.h"
#include "suites/train.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {
const fs::path& merge_tmp() {
  static const fs::path dir = mixbench_test::scratch_dir("lb_merge_test");
  return dir;
}

using mixbench_test::count_of;

// The options every part and the combine share.
const std::vector<std::string> kBase = {"leaderboard", "--config", "seq_len=32", "--steps", "2", "--batch", "1", "--probes", "0"};

int run(std::vector<std::string> extra, std::string* out = nullptr, std::string* err = nullptr) {
  std::vector<std::string> args = kBase;
  args.insert(args.end(), extra.begin(), extra.end());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int rc = run_cli(args);
  const std::string o = testing::internal::GetCapturedStdout(), e = testing::internal::GetCapturedStderr();
  if (out) *out = o;
  if (err) *err = e;
  return rc;
}
}  // namespace

TEST(LeaderboardMerge, PartsCombineToTheWholeRun) {
  const fs::path dir = merge_tmp() / "parts";
  fs::create_directories(dir);
  auto path = [&](const char* name) { return (dir / name).string(); };
  const std::string whole = path("whole.json"), a = path("a.json"), b = path("b.json"), c = path("c.json");
  std::string out, err;
  ASSERT_EQ(run({"--methods", "dense_full,mqa", "--seed", "3", "--seeds", "2", "--out", whole, "--quiet"}, &out, &err), 0) << err;
  // the parts: one method at both seeds, the other at one seed each
  ASSERT_EQ(run({"--methods", "dense_full", "--seed", "3", "--seeds", "2", "--out", a, "--quiet"}, &out, &err), 0) << err;
  ASSERT_EQ(run({"--methods", "mqa", "--seed", "3", "--seeds", "1", "--out", b, "--quiet"}, &out, &err), 0) << err;
  ASSERT_EQ(run({"--methods", "mqa", "--seed", "4", "--seeds", "1", "--out", c, "--quiet"}, &out, &err), 0) << err;

  // combined: every cell kept, none trained, the rows the whole run's
  const std::vector<std::string> all = {"--methods", "dense_full,mqa", "--seed", "3", "--seeds", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = all;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  const std::string combined = path("combined.json");
  ASSERT_EQ(run(with({"--from", a + "," + b, "--from", c, "--out", combined}), &out, &err), 0) << err;
  EXPECT_EQ(count_of(out, "\"state\":\"trained\""), 0u) << out;
  EXPECT_EQ(count_of(out, "\"state\":\"kept\""), 4u) << out;
  const Json w = Json::parse(read_file(whole)), r = Json::parse(read_file(combined));
  EXPECT_TRUE(validate_json(r, report_schema()).empty());
  EXPECT_EQ(r["merged_from"], Json({a, b, c}));
  EXPECT_FALSE(r["config"].contains("merged_from"));
  EXPECT_TRUE(r["summary"]["complete"].get<bool>());
  EXPECT_EQ(r["summary"]["missing"], Json::array());
  ASSERT_EQ(r["results"].size(), 2u);
  ASSERT_EQ(w["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Json &x = r["results"][i], &y = w["results"][i];
    EXPECT_EQ(x["method"], y["method"]);
    EXPECT_EQ(x["seeds"], Json({3, 4}));
    for (const char* f : {"val_bpb", "val_bpb_seeds", "val_bpb_sd", "val_bpb_ci95", "delta_vs_dense_full",
                          "delta_vs_dense_full_ci95", "rank", "loss_curve", "calibration"})
      EXPECT_EQ(x[f], y[f]) << f;
    ASSERT_EQ(x["runs"].size(), 2u);
    for (size_t k = 0; k < 2; ++k) EXPECT_EQ(x["runs"][k]["val_bpb"], y["runs"][k]["val_bpb"]);
  }
  for (const char* ext : {".md", ".html"}) EXPECT_TRUE(fs::exists(fs::path(combined).replace_extension(ext))) << ext;

  // --no-train: what the parts hold, the rest listed as missing; nothing trained
  const std::string partial = path("partial.json");
  ASSERT_EQ(run(with({"--from", a, b, "--no-train", "--out", partial}), &out, &err), 0) << err;
  EXPECT_EQ(count_of(out, "\"state\":\"trained\""), 0u) << out;
  EXPECT_NE(err.find("1 of 4 cells missing"), std::string::npos) << err;
  const Json p = Json::parse(read_file(partial));
  EXPECT_FALSE(p["summary"]["complete"].get<bool>());
  EXPECT_EQ(p["summary"]["cells_done"], 3);
  EXPECT_EQ(p["summary"]["missing"], Json::array({Json::array({"mqa", 4})}));
  EXPECT_NE(p["markdown"].get<std::string>().find("mqa seed 4"), std::string::npos);
  EXPECT_EQ(p["results"][1]["seeds"], Json({3}));

  // the same cell in two files: kept from the first when the values agree, refused when not
  ASSERT_EQ(run(with({"--from", a, b, c, c, "--no-train", "--out", path("twice.json")}), &out, &err), 0) << err;
  Json c2 = Json::parse(read_file(c));
  c2["results"][0]["runs"][0]["val_bpb"] = c2["results"][0]["runs"][0]["val_bpb"].get<double>() + 1e-9;
  const std::string other = path("c_other.json");
  write_file_atomic(other, c2.dump());
  EXPECT_EQ(run(with({"--from", a, b, c, other, "--no-train", "--out", path("clash.json")}), &out, &err), 2);
  EXPECT_NE(err.find("'" + c + "' and '" + other + "' both hold mqa seed 4"), std::string::npos) << err;
  EXPECT_NE(err.find("val_bpb"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(path("clash.json")));

  // a part whose cell failed: shown failed (exit 1), as the part had it
  Json c3 = Json::parse(read_file(c));
  c3["results"][0]["runs"][0] = {{"status", "error"}, {"method", "mqa"}, {"seed", 4}, {"message", "out of memory"}};
  const std::string failed = path("c_failed.json");
  write_file_atomic(failed, c3.dump());
  ASSERT_EQ(run(with({"--from", a, b, failed, "--no-train", "--out", path("failed.json")}), &out, &err), 1) << err;
  const Json f = Json::parse(read_file(path("failed.json")));
  EXPECT_EQ(f["summary"]["missing"], Json::array());
  ASSERT_EQ(f["results"].size(), 2u);
  EXPECT_EQ(f["results"][1]["status"], "error");
  EXPECT_NE(f["results"][1]["message"].get<std::string>().find("out of memory"), std::string::npos);
}

// --cell-checkpoints: a cell stopped part-way (here: its run stopped after 2 of 4 steps in the
// cell's folder) is finished from its checkpoint with the uninterrupted cell's values, the folder is
// removed once the cell is in the report, and a checkpoint of another run there fails the cell
// naming it.
TEST(LeaderboardMerge, AStoppedCellResumesFromItsCheckpoint) {
  const fs::path dir = merge_tmp() / "cell_ckpt";
  fs::remove_all(dir);
  LeaderboardOptions lo;
  lo.preset = "tiny";
  lo.methods = {"dense_full"};
  lo.config = "seq_len=32";
  lo.steps = 4;
  lo.batch = 1;
  lo.probe_sequences = 0;
  lo.seed = 3;
  lo.seeds = 1;
  std::string md;
  const Json whole = run_leaderboard(lo, md);
  ASSERT_EQ(whole[0]["status"], "ok") << whole[0].dump();

  lo.cell_checkpoints = dir.string();
  const Calibration cal = calibrate("dense_full", lo.preset, lo.config);
  TrainOptions part = leaderboard_cell_options(lo, "dense_full", 3, cal);
  EXPECT_EQ(part.out, (dir / "dense_full.s3").string());
  EXPECT_FALSE(part.resume) << "nothing to resume yet";
  part.stop_after = 2;
  run_train(part);
  ASSERT_TRUE(fs::exists(dir / "dense_full.s3" / "checkpoint.safetensors"));
  EXPECT_TRUE(leaderboard_cell_options(lo, "dense_full", 3, cal).resume);
  const Json resumed = run_leaderboard(lo, md);
  ASSERT_EQ(resumed[0]["status"], "ok") << resumed[0].dump();
  EXPECT_EQ(resumed[0]["val_bpb"], whole[0]["val_bpb"]);
  EXPECT_EQ(resumed[0]["runs"][0]["loss_curve"], whole[0]["runs"][0]["loss_curve"]);
  EXPECT_FALSE(fs::exists(dir / "dense_full.s3")) << "the finished cell's folder is removed";

  // another run's checkpoint (seed 4) in seed 3's folder: the cell fails, naming the checkpoint
  TrainOptions other = leaderboard_cell_options(lo, "dense_full", 4, cal);
  other.out = (dir / "dense_full.s3").string();
  other.stop_after = 2;
  run_train(other);
  const Json refused = run_leaderboard(lo, md);
  EXPECT_EQ(refused[0]["status"], "error");
  EXPECT_NE(refused[0].dump().find("belongs to a different run"), std::string::npos) << refused[0].dump();
  EXPECT_TRUE(fs::exists(dir / "dense_full.s3" / "checkpoint.safetensors")) << "a failed cell keeps its folder";

  // one budget only
  lo.budgets = {parse_budget("steps=2"), parse_budget("steps=4")};
  EXPECT_THROW(run_leaderboard(lo, md), UsageError);
}

TEST(LeaderboardMerge, BadPartsAreRefusedNamingTheFile) {
  const fs::path dir = merge_tmp() / "bad";
  fs::create_directories(dir);
  const std::string out_path = (dir / "out.json").string();
  std::string out, err;
  // a file that is not there
  const std::string gone = (dir / "gone.json").string();
  EXPECT_EQ(run({"--methods", "dense_full", "--from", gone, "--out", out_path}, &out, &err), 2);
  EXPECT_NE(err.find("--from '" + gone + "': no such file"), std::string::npos) << err;
  // not JSON
  const std::string junk = (dir / "junk.json").string();
  write_file_atomic(junk, "not json");
  EXPECT_EQ(run({"--methods", "dense_full", "--from", junk, "--out", out_path}, &out, &err), 2);
  EXPECT_NE(err.find("--from '" + junk + "': not a JSON report"), std::string::npos) << err;
  // a leaderboard of other options: refused naming the field
  LeaderboardOptions o;
  o.methods = {"dense_full"};
  o.config = "seq_len=32";
  o.steps = 2;
  o.batch = 1;
  o.probe_sequences = 0;
  Json config = leaderboard_config(o);
  const Json part = {{"kind", "leaderboard"}, {"config", config}, {"results", Json::array()}};
  const std::string same = (dir / "same.json").string();
  write_file_atomic(same, part.dump());
  EXPECT_EQ(run({"--methods", "dense_full", "--from", same, "--no-train", "--out", out_path, "--quiet"}, &out, &err), 0) << err;
  for (const auto& [field, value] : std::vector<std::pair<std::string, Json>>{{"steps", 3}, {"config", "seq_len=16"}, {"probes", 1}}) {
    Json other = part;
    other["config"][field] = value;
    const std::string file = (dir / ("other_" + field + ".json")).string();
    write_file_atomic(file, other.dump());
    EXPECT_EQ(run({"--methods", "dense_full", "--from", same, file, "--out", out_path}, &out, &err), 2) << field;
    EXPECT_NE(err.find("--from '" + file + "': the report was written with " + field + " = "), std::string::npos) << err;
  }
  // another kind of report
  Json train = part;
  train["kind"] = "train";
  const std::string train_file = (dir / "train.json").string();
  write_file_atomic(train_file, train.dump());
  EXPECT_EQ(run({"--methods", "dense_full", "--from", train_file, "--out", out_path}, &out, &err), 2);
  EXPECT_NE(err.find("--from '" + train_file + "': not a leaderboard report"), std::string::npos) << err;
  // the methods and the seeds of a part may differ from the combine's
  Json seeds = part;
  seeds["config"]["seed"] = 7;
  seeds["config"]["seeds"] = 1;
  seeds["config"]["method_names"] = Json::array({"mqa"});
  const std::string seeds_file = (dir / "seeds.json").string();
  write_file_atomic(seeds_file, seeds.dump());
  EXPECT_EQ(run({"--methods", "dense_full", "--seeds", "2", "--from", seeds_file, "--no-train", "--out", out_path, "--quiet"},
                &out, &err),
            0)
      << err;
  EXPECT_EQ(Json::parse(read_file(out_path))["summary"]["missing"].size(), 2u);
}
