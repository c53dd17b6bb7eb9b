// Tests of data-parallel training over c10d (Gloo on the CPU, localhost): the built `mixbench` binary
// runs as several ranks, started by --nproc or by hand with torchrun's variables. Two ranks give the
// one-process losses; a 2-rank checkpoint resumes on one rank; a rank that dies or hangs makes the
// others stop within the timeout naming it, with the last checkpoint intact; bad input exits 2.
#include <gtest/gtest.h>
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "harness/args.h"
#include "harness/cli/cli.h"
#include "harness/io.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/distributed.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

// This test process's folder (created on first use).
fs::path dist_tmp() {
  const fs::path p = fs::temp_directory_path() / fmt::format("mixbench_dist_test_{}", ::getpid());
  fs::create_directories(p);
  return p;
}

// The binary beside the test executable.
std::string mixbench_bin() { return (fs::read_symlink("/proc/self/exe").parent_path() / "mixbench").string(); }

// A port nobody listens on (now).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// torchrun's variables cleared, then `env` (VAR=value ...) set.
std::string clean_env(const std::string& env) {
  return "env -u WORLD_SIZE -u RANK -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT " + env;
}

struct Outcome {
  int rc = -1;
  std::string log;  // stdout and stderr
  double seconds = 0;
};

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// One `mixbench ARGS` process.
Outcome run_bin(const std::string& env, const std::string& args) {
  static int n = 0;
  const fs::path log = dist_tmp() / fmt::format("run{}.log", n++);
  const auto t0 = std::chrono::steady_clock::now();
  const int st = std::system(fmt::format("{} {} {} > {} 2>&1", clean_env(env), mixbench_bin(), args, log.string()).c_str());
  Outcome o;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.rc = exit_code(st);
  o.log = read_file(log.string());
  return o;
}

// Two ranks started by hand (as torchrun would): env0/env1 are each rank's extra variables.
std::pair<Outcome, Outcome> run_pair(const std::string& env0, const std::string& env1, const std::string& args,
                                     int world0 = 2, int world1 = 2) {
  static int n = 0;
  const int port = free_port();
  const fs::path base = dist_tmp() / fmt::format("pair{}", n++);
  std::string cmd;
  for (int r = 0; r < 2; ++r)
    cmd += fmt::format("({} MASTER_ADDR=127.0.0.1 MASTER_PORT={} RANK={} LOCAL_RANK={} WORLD_SIZE={} {} {} > {}.log{} 2>&1; "
                       "echo $? > {}.rc{}) & ",
                       clean_env(r == 0 ? env0 : env1), port, r, r, r == 0 ? world0 : world1, mixbench_bin(), args,
                       base.string(), r, base.string(), r);
  const auto t0 = std::chrono::steady_clock::now();
  std::system(("bash -c '" + cmd + "wait'").c_str());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::pair<Outcome, Outcome> out;
  for (int r = 0; r < 2; ++r) {
    Outcome& o = r == 0 ? out.first : out.second;
    o.rc = std::stoi(read_file(fmt::format("{}.rc{}", base.string(), r)));
    o.log = read_file(fmt::format("{}.log{}", base.string(), r));
    o.seconds = secs;
  }
  return out;
}

const char* kCfg = "n_layer=2,d_model=64,head_dim=32,seq_len=32";
constexpr int64_t kSteps = 20;

// The run every test shares: 4 rows per step in micro-batches of 2 (one per rank over two ranks).
std::string train_args(const std::string& extra) {
  return fmt::format("train --method dense --config {} --steps {} --batch 4 --micro-batch 2 --seed 7 --eval-every 5 "
                     "--eval-batches 1 --probes 0 --quiet {}",
                     kCfg, kSteps, extra);
}

// `mixbench ARGS` in this process (one rank, no torchrun variables): its train.json result.
Json train_here(const fs::path& out, const std::string& extra) {
  std::vector<std::string> argv;
  for (const auto& w : split(train_args(fmt::format("--out {} {}", out.string(), extra)), ' '))
    if (!w.empty()) argv.push_back(w);
  EXPECT_EQ(run_cli(argv), 0);
  return Json::parse(read_file((out / "train.json").string()))["results"][0];
}

// The uninterrupted one-process run.
const Json& one_rank() {
  static const Json r = train_here(dist_tmp() / "one", "");
  return r;
}

std::vector<double> losses_of(const Json& r) { return r["loss_curve"].get<std::vector<double>>(); }

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want, size_t n) {
  ASSERT_GE(got.size(), n);
  ASSERT_GE(want.size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i])) << "step " << i + 1;
}

}  // namespace

TEST(Distributed, TwoRanksGiveTheOneProcessLosses) {
  const fs::path dir = dist_tmp() / "two";
  const Outcome o = run_bin("", train_args(fmt::format("--nproc 2 --dist-timeout 30 --out {}", dir.string())));
  ASSERT_EQ(o.rc, 0) << o.log;
  const Json rep = Json::parse(read_file((dir / "train.json").string()));
  EXPECT_TRUE(validate_json(rep, report_schema()).empty());
  const Json& r = rep["results"][0];
  EXPECT_EQ(r["world_size"], 2);
  EXPECT_EQ(r["backend"], "gloo");
  Json bad = rep;  // the schema knows the two fields
  bad["results"][0]["world_size"] = 0;
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  bad["results"][0]["world_size"] = "2";
  EXPECT_FALSE(validate_json(bad, report_schema()).empty());
  const auto losses = losses_of(r);
  ASSERT_EQ(losses.size(), size_t(kSteps));
  expect_same_losses(losses, losses_of(one_rank()), kSteps);
  EXPECT_NEAR(r["val_bpb"].get<double>(), one_rank()["val_bpb"].get<double>(), 1e-6 * one_rank()["val_bpb"].get<double>());
  EXPECT_EQ(one_rank()["world_size"], 1);
  EXPECT_EQ(one_rank()["backend"], "none");
  // the run trains (the losses move far more than the tolerance)
  EXPECT_GT(losses.front() - losses.back(), 0.1);
}

TEST(Distributed, TwoRankCheckpointResumesOnOneRank) {
  const fs::path dir = dist_tmp() / "resume";
  const Outcome o = run_bin("", train_args(fmt::format("--nproc 2 --dist-timeout 30 --stop-after 10 --out {}", dir.string())));
  ASSERT_EQ(o.rc, 0) << o.log;
  const SafetensorsFile f = read_safetensors((dir / "checkpoint.safetensors").string());
  EXPECT_EQ(f.metadata.at("world_size"), "2");
  EXPECT_EQ(f.metadata.at("step"), "10");
  const Json r = train_here(dir, "--resume");
  expect_same_losses(losses_of(r), losses_of(one_rank()), kSteps);
  EXPECT_NEAR(r["val_bpb"].get<double>(), one_rank()["val_bpb"].get<double>(), 1e-6 * one_rank()["val_bpb"].get<double>());
  EXPECT_EQ(r["world_size"], 1);
}

TEST(Distributed, DeadRankIsNamedAndTheCheckpointSurvives) {
  const fs::path dir = dist_tmp() / "dead";
  // the last rank kills itself (SIGKILL) at the start of step 7; checkpoints every 2 steps
  const auto [r0, r1] = run_pair("MIXBENCH_TEST_DIE_AT_STEP=7", "MIXBENCH_TEST_DIE_AT_STEP=7",
                                 train_args(fmt::format("--checkpoint-every 2 --dist-timeout 10 --out {}", dir.string())));
  EXPECT_EQ(r1.rc, 128 + 9) << r1.log;
  EXPECT_NE(r0.rc, 0) << r0.log;
  EXPECT_NE(r0.log.find("rank 1 stopped responding after the gradient all-reduce of step 6"), std::string::npos) << r0.log;
  EXPECT_LT(r0.seconds, 40.0);
  // the checkpoint of step 6 is intact: it resumes and continues the one-process curve
  const SafetensorsFile f = read_safetensors((dir / "checkpoint.safetensors").string());
  EXPECT_EQ(f.metadata.at("step"), "6");
  const Json r = train_here(dir, "--resume --stop-after 8");
  EXPECT_EQ(r["steps"], 8);
  expect_same_losses(losses_of(r), losses_of(one_rank()), 8);
}

TEST(Distributed, FailingRankIsNamedWithItsError) {
  // the last rank throws as step 4 starts: it records its error in the store, and rank 0 quotes it
  const auto [r0, r1] = run_pair("", "MIXBENCH_TEST_FAIL_AT_STEP=4", train_args("--dist-timeout 10"));
  EXPECT_EQ(r1.rc, 3) << r1.log;
  EXPECT_NE(r0.rc, 0) << r0.log;
  EXPECT_NE(r0.log.find("rank 1 failed: MIXBENCH_TEST_FAIL_AT_STEP: step 4 fails"), std::string::npos) << r0.log;
}

TEST(Distributed, HungRankTimesOutAndTheLauncherStops) {
  // the last rank stops inside step 3; rank 0's all-reduce times out (3 s) naming it, and --nproc's
  // launcher stops the hung rank and exits non-zero naming the rank that failed
  const auto o = run_bin("MIXBENCH_TEST_HANG_AT_STEP=3", train_args("--nproc 2 --dist-timeout 3"));
  EXPECT_NE(o.rc, 0) << o.log;
  EXPECT_NE(o.log.find("rank 1 stopped responding in step 3, before its gradient all-reduce"), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("mixbench: error: rank 0 exited with code 3; stopping the other ranks"), std::string::npos) << o.log;
  EXPECT_LT(o.seconds, 40.0);
}

TEST(Distributed, BadInputExitsTwoWithItsMessage) {
  auto expect2 = [](const Outcome& o, const std::string& msg) {
    EXPECT_EQ(o.rc, 2) << o.log;
    EXPECT_NE(o.log.find(msg), std::string::npos) << "expected '" << msg << "' in:\n" << o.log;
  };
  const int port = free_port();
  const std::string addr = fmt::format("MASTER_ADDR=127.0.0.1 MASTER_PORT={}", port);
  expect2(run_bin("", "train --method dense --config n_layer=1 --steps 1 --batch 3 --nproc 2 --quiet"),
          "the batch of 3 rows cannot be shared out evenly over 2 ranks");
  expect2(run_bin(addr + " RANK=2 WORLD_SIZE=2", train_args("")), "RANK 2 must be < WORLD_SIZE 2");
  expect2(run_bin("RANK=0", train_args("")), "MASTER_ADDR, MASTER_PORT, WORLD_SIZE missing");
  expect2(run_bin("", train_args("--nproc 4096 --device cuda")), "--nproc 4096 with --device cuda: only");
  expect2(run_bin("", train_args("--nproc 0")), "--nproc must be in [1, 4096]");
  // nobody hosts the store at that port: rank 1 gives up after --dist-timeout
  const Outcome lone = run_bin(addr + " RANK=1 WORLD_SIZE=2", train_args("--dist-timeout 2"));
  expect2(lone, "rank 1: cannot reach the rendezvous store at 127.0.0.1:");
  EXPECT_LT(lone.seconds, 30.0);
  // WORLD_SIZE differs between the ranks: both refuse
  const auto [r0, r1] = run_pair("", "", train_args("--dist-timeout 10"), 2, 3);
  expect2(r0, "WORLD_SIZE is 2 on rank 0 but 3 on rank 1");
  expect2(r1, "WORLD_SIZE is 3 on rank 1 but 2 on rank 0");
}

TEST(Distributed, LeaderboardTrainsEachMethodOverTheRanks) {
  const std::string args = fmt::format("leaderboard --methods dense,gdn --config {} --steps 4 --batch 4 --micro-batch 2 "
                                       "--seed 3 --probes 2 --quiet --out ",
                                       kCfg);
  const fs::path two = dist_tmp() / "lb2.json", one = dist_tmp() / "lb1.json";
  const Outcome o = run_bin("", args + two.string() + " --nproc 2 --dist-timeout 30");
  ASSERT_EQ(o.rc, 0) << o.log;
  std::vector<std::string> argv;
  for (const auto& w : split(args + one.string(), ' '))
    if (!w.empty()) argv.push_back(w);
  ASSERT_EQ(run_cli(argv), 0);
  const Json a = Json::parse(read_file(two.string())), b = Json::parse(read_file(one.string()));
  EXPECT_TRUE(validate_json(a, report_schema()).empty());
  ASSERT_EQ(a["results"].size(), 2u);
  ASSERT_EQ(b["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const Json &x = a["results"][i], &y = b["results"][i];
    EXPECT_EQ(x["method"], y["method"]);
    EXPECT_EQ(x["world_size"], 2);
    EXPECT_EQ(x["backend"], "gloo");
    EXPECT_EQ(y["world_size"], 1);
    expect_same_losses(losses_of(x), losses_of(y), 4);
    EXPECT_NEAR(x["val_bpb"].get<double>(), y["val_bpb"].get<double>(), 1e-6 * y["val_bpb"].get<double>());
    EXPECT_EQ(x["probes"], y["probes"]);  // rank 0 ran them on the same model
  }
}

// Two ranks in this process (a thread each): small buckets, two micro-batches (the first unarmed), a
// parameter only rank 0 uses and one nobody uses. Every rank ends with the sums of the ranks' gradients.
TEST(Distributed, BucketsSumTheGradientsOfEveryParameter) {
  const int port = free_port();
  const std::vector<int64_t> sizes = {300, 7, 500, 64, 1000, 3};  // "p0".."p5"; p4 rank 0 only, p5 nobody
  auto coeff = [&](int rank, int micro, size_t i) {
    return at::arange(sizes[i], at::kFloat).mul(0.01f * float(i + 1)).add(float(rank) + 0.5f * float(micro)).sin();
  };
  std::vector<std::vector<at::Tensor>> grads(2);
  std::vector<size_t> buckets(2);
  std::vector<std::string> errors(2);
  auto rank = [&](int r) {
    try {
      DistEnv e;
      e.rank = r;
      e.world = 2;
      e.master_addr = "127.0.0.1";
      e.master_port = port;
      auto dp = DataParallel::connect(e, "cpu", std::chrono::seconds(20));
      Model m;
      for (size_t i = 0; i < sizes.size(); ++i)
        m.params.set(fmt::format("p{}", i), at::zeros({sizes[i]}, at::kFloat).requires_grad_(true));
      auto red = dp->reducer(m, 1200);  // a few parameters per bucket
      buckets[r] = red->buckets();
      for (int micro = 0; micro < 2; ++micro) {
        red->arm(micro == 1);
        at::Tensor loss = at::zeros({}, at::kFloat);
        for (size_t i = 0; i < 4; ++i) loss = loss + (m.params.at(fmt::format("p{}", i)) * coeff(r, micro, i)).sum();
        if (r == 0) loss = loss + (m.params.at("p4") * coeff(r, micro, 4)).sum();
        loss.backward();
      }
      red->finish();
      for (size_t i = 0; i < sizes.size(); ++i) grads[r].push_back(m.params.at(fmt::format("p{}", i)).grad());
    } catch (const std::exception& ex) {
      errors[r] = ex.what();
    }
  };
  std::thread t1(rank, 1);
  rank(0);
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_GT(buckets[0], 2u);
  for (size_t i = 0; i < sizes.size(); ++i) {
    at::Tensor want = at::zeros({sizes[i]}, at::kFloat);
    if (i < 4) want = (coeff(0, 0, i) + coeff(0, 1, i)) + (coeff(1, 0, i) + coeff(1, 1, i));
    if (i == 4) want = coeff(0, 0, i) + coeff(0, 1, i);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(grads[r][i].defined()) << "rank " << r << " p" << i;
      EXPECT_TRUE(at::equal(grads[r][i], want)) << "rank " << r << " p" << i;
    }
  }
}
