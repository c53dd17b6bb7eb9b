// Usage errors of `mixbench train` and `mixbench leaderboard`: an explicit --batch 0 is refused (the
// preset's batch is what leaving the option out gives), and --resume without a checkpoint names the
// checkpoint in its message; --dry-run lists the parameters' optimizer settings.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <map>

#include "harness/cli/cli.h"
#include "harness/registry.h"
#include "harness/errors.h"
#include "harness/safetensors.h"
#include "suites/train.h"

namespace fs = std::filesystem;
using namespace mixbench;

namespace {
// Exit code and stderr of one CLI call.
std::pair<int, std::string> cli_err(const std::vector<std::string>& args) {
  testing::internal::CaptureStderr();
  const int rc = run_cli(args);
  return {rc, testing::internal::GetCapturedStderr()};
}
}  // namespace

TEST(TrainUsage, ExplicitBatchZeroIsRefused) {
  for (const char* cmd : {"train", "leaderboard"}) {
    std::vector<std::string> args = {cmd, "--batch", "0", "--steps", "1", "--quiet"};
    if (std::string(cmd) == "train") args.insert(args.begin() + 1, {"--method", "dense"});
    else args.insert(args.begin() + 1, {"--methods", "dense"});
    auto [rc, err] = cli_err(args);
    EXPECT_EQ(rc, 2) << cmd;
    EXPECT_NE(err.find("--batch must be >= 1"), std::string::npos) << cmd << ": " << err;
  }
}

TEST(TrainUsage, ResumeWithoutCheckpointNamesTheCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("mixbench_train_usage_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  TrainOptions o;
  o.method = "dense";
  o.config = "n_layer=2,d_model=64,head_dim=32,seq_len=32";
  o.steps = 1;
  o.out = dir.string();
  o.resume = true;
  std::string msg;
  try {
    run_train(o);
  } catch (const InputError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("checkpoint '" + (dir / "checkpoint.safetensors").string() + "': cannot open"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("golden"), std::string::npos) << msg;
  // The reader's default role is still the golden file's.
  try {
    read_safetensors((dir / "none.safetensors").string());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("golden file '"), std::string::npos) << e.what();
  }
  fs::remove(dir);
}

// `train --dry-run` lists every parameter of the model once with its optimizer group and
// hyper-parameters (the same the optimizer uses), and trains nothing.
TEST(TrainUsage, DryRunListsEveryParameterWithItsGroup) {
  testing::internal::CaptureStdout();
  const int rc = run_cli({"train", "--method", "gdn", "--preset", "tiny", "--dry-run", "--json"});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json s = nlohmann::json::parse(out);
  TrainOptions o;
  o.method = "gdn";
  o.preset = "tiny";
  EXPECT_EQ(s, optimizer_settings(o));
  std::map<std::string, nlohmann::json> rows;
  for (const auto& r : s["params"]) EXPECT_TRUE(rows.emplace(r["param"].get<std::string>(), r).second) << r["param"];
  const MethodSpec& ms = Registry::get().method("gdn");
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(0);
  const Model m = build_model(ms, ms.config.parse(train_preset("tiny").config_for("gdn")), g, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(rows.size(), m.params.size());
  for (const auto& [name, t] : m.params) {
    ASSERT_TRUE(rows.count(name)) << name;
    EXPECT_GT(rows[name]["lr"].get<double>(), 0.0) << name;
    if (rows[name]["optimizer"] == "muon") EXPECT_EQ(t.dim(), 2) << name;
  }
  EXPECT_EQ(rows.at("layers.0.mlp.c_fc")["optimizer"], "muon");
  EXPECT_EQ(rows.at("layers.0.mixer.A_log")["optimizer"], "adamw");
  EXPECT_EQ(rows.at("wte")["optimizer"], "adamw");
  // the table form names the same parameters
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"train", "--method", "gdn", "--preset", "tiny", "--dry-run"}), 0);
  const std::string table = testing::internal::GetCapturedStdout();
  EXPECT_NE(table.find("layers.0.mixer.A_log"), std::string::npos);
  EXPECT_NE(table.find("muon"), std::string::npos);
}
