// The app layer: every command documents itself from the one command table, the source tree keeps
// its layering (harness core / harness/cli / suites / reports), the suites the commands call work
// without the command line, and the HTML pages keep their exact bytes.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "tests/source_dir.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/config.h"
#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "reports/html.h"
#include "reports/leaderboard.h"
#include "reports/plot.h"
#include "suites/account.h"
#include "suites/golden.h"

namespace fs = std::filesystem;
using namespace mixbench;
using Json = nlohmann::json;

namespace {

fs::path app_tmp(const std::string& name) {
  return fs::temp_directory_path() / fmt::format("mixbench_app_{}_{}", ::getpid(), name);
}

struct CliRun {
  int rc;
  std::string out, err;
};
CliRun run(const std::vector<std::string>& args) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int rc = run_cli(args);
  std::string out = testing::internal::GetCapturedStdout();
  std::string err = testing::internal::GetCapturedStderr();
  return {rc, out, err};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

// ---------------------------------------------------------------- self-documenting commands
TEST(AppHelp, EveryCommandPrintsItsUsageAndOptions) {
  ASSERT_GE(commands().size(), 11u);
  for (const Command& c : commands()) {
    SCOPED_TRACE(c.name);
    const CliRun a = run({c.name, "--help"});
    EXPECT_EQ(a.rc, 0) << a.err;
    EXPECT_TRUE(has(a.out, "usage: mixbench " + c.name)) << a.out;
    EXPECT_TRUE(has(a.out, c.summary)) << a.out;
    for (const OptionDoc& o : c.options) {
      EXPECT_FALSE(o.help.empty()) << o.name;
      EXPECT_TRUE(has(a.out, "--" + o.name + (o.value.empty() ? "" : " " + o.value) + " ")) << o.name << "\n" << a.out;
      EXPECT_TRUE(has(a.out, o.help)) << o.name;
    }
    // one line per option (plus --help) under "options:"
    const std::string opts = a.out.substr(a.out.find("\noptions:\n") + 10);
    EXPECT_EQ(size_t(std::count(opts.begin(), opts.end(), '\n')), c.options.size() + 1) << opts;
    const CliRun b = run({"help", c.name});
    EXPECT_EQ(b.rc, 0) << b.err;
    EXPECT_EQ(b.out, a.out);
    const CliRun h = run({c.name, "-h"});
    EXPECT_EQ(h.rc, 0);
    EXPECT_EQ(h.out, a.out);
  }
  // --help wins over anything else on the line, even options the command does not know
  const CliRun lb = run({"leaderboard", "--methods", "dense", "--help", "--bogus"});
  EXPECT_EQ(lb.rc, 0) << lb.err;
  EXPECT_TRUE(has(lb.out, "--micro-batch M"));
}

TEST(AppHelp, OverviewListsEveryCommandOnOneLine) {
  const CliRun h = run({"help"});
  EXPECT_EQ(h.rc, 0);
  for (const Command& c : commands()) {
    const size_t at = h.out.find("\n  " + c.name + " ");
    ASSERT_NE(at, std::string::npos) << c.name << "\n" << h.out;
    std::string line = h.out.substr(at + 3 + c.name.size());
    line = line.substr(0, line.find('\n'));
    EXPECT_EQ(line.substr(line.find_first_not_of(' ')), c.summary) << c.name;
  }
  EXPECT_EQ(run({"--help"}).out, h.out);
  EXPECT_EQ(run({"-h"}).rc, 0);
  const CliRun none = run({});
  EXPECT_EQ(none.rc, 2);  // no command is bad usage, with the list as the hint
  EXPECT_EQ(none.out, h.out);
}

TEST(AppHelp, UnknownCommandNamesTheClosest) {
  const CliRun a = run({"help", "leaderbord"});
  EXPECT_EQ(a.rc, 2);
  EXPECT_TRUE(has(a.err, "unknown command 'leaderbord'")) << a.err;
  EXPECT_TRUE(has(a.err, "leaderboard")) << a.err;
  const CliRun b = run({"acount"});
  EXPECT_EQ(b.rc, 2);
  EXPECT_TRUE(has(b.err, "account")) << b.err;
  EXPECT_EQ(run({"help", "list", "sweep"}).rc, 2);
}

TEST(AppHelp, ParserAcceptsExactlyTheDocumentedOptions) {
  for (const Command& c : commands()) {
    SCOPED_TRACE(c.name);
    std::set<std::string> names;
    for (const OptionDoc& o : c.options) {
      EXPECT_TRUE(names.insert(o.name).second) << "documented twice: " << o.name;
      std::vector<std::string> argv = {"--" + o.name};
      if (o.kind != OptionKind::Flag) argv.push_back("1");
      Args a = parse_command_args(c, argv);
      if (o.kind == OptionKind::Flag) EXPECT_TRUE(a.flag(o.name));
      else EXPECT_EQ(a.get_or(o.name, ""), "1");
      if (o.kind == OptionKind::Flag) EXPECT_THROW(parse_command_args(c, {"--" + o.name + "=1"}), UsageError);
      else EXPECT_THROW(parse_command_args(c, {"--" + o.name}), UsageError);  // a value is required
    }
    EXPECT_THROW(parse_command_args(c, {"--not-an-option"}), UsageError);
  }
  const Command* c = find_command("conformance");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(parse_command_args(*c, {"--methods", "a", "b,c"}).list("methods"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(find_command("nosuch"), nullptr);
}

// ---------------------------------------------------------------- layering
namespace {
// The layering rules for one source file (path relative to the source root) and one of its
// includes; empty when allowed.
std::string layering_violation(const std::string& file, const std::string& include) {
  auto under = [](const std::string& p, const std::string& dir) { return p.rfind(dir, 0) == 0; };
  const bool in_cli = under(file, "harness/cli/");
  if (under(file, "harness/") && !in_cli)
    for (const char* banned : {"harness/cli/", "suites/", "reports/"})
      if (under(include, banned)) return file + " (harness core) includes " + include;
  if (!in_cli && !under(file, "tests/") && under(include, "harness/cli/"))
    return file + " (outside the app layer) includes " + include;
  return "";
}
}  // namespace

TEST(AppLayering, RulesCatchViolations) {
  EXPECT_NE(layering_violation("harness/registry.cpp", "suites/conformance.h"), "");
  EXPECT_NE(layering_violation("harness/report.h", "reports/render.h"), "");
  EXPECT_NE(layering_violation("harness/io.cpp", "harness/cli/cli.h"), "");
  EXPECT_NE(layering_violation("suites/sweep.cpp", "harness/cli/commands.h"), "");
  EXPECT_NE(layering_violation("reports/plot.cpp", "harness/cli/common.h"), "");
  EXPECT_NE(layering_violation("mixers/dense/layer.cpp", "harness/cli/cli.h"), "");
  EXPECT_EQ(layering_violation("harness/cli/cmd_sweep.cpp", "suites/sweep.h"), "");
  EXPECT_EQ(layering_violation("harness/cli/cmd_train.cpp", "reports/leaderboard.h"), "");
  EXPECT_EQ(layering_violation("tests/test_app_layer.cpp", "harness/cli/cli.h"), "");
  EXPECT_EQ(layering_violation("suites/train.cpp", "harness/registry.h"), "");
}

TEST(AppLayering, SourceTreeKeepsItsLayers) {
  const fs::path root(mixbench_test::source_dir());
  const std::regex include_re(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<std::string> violations;
  int files = 0, cli_files = 0;
  for (const char* top : {"harness", "suites", "reports", "mixers", "reference", "bench", "python", "tests"}) {
    if (!fs::exists(root / top)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".in")) continue;
      const std::string rel = fs::relative(e.path(), root).generic_string();
      ++files;
      if (rel.rfind("harness/cli/", 0) == 0) ++cli_files;
      std::ifstream in(e.path());
      std::string line;
      std::smatch m;
      while (std::getline(in, line))
        if (std::regex_search(line, m, include_re)) {
          const std::string v = layering_violation(rel, m[1]);
          if (!v.empty()) violations.push_back(v);
        }
    }
  }
  EXPECT_GE(files, 50);
  EXPECT_GE(cli_files, 8);  // the app layer lives in harness/cli/
  EXPECT_TRUE(fs::exists(root / "harness/cli/main.cpp"));
  for (const auto& v : violations) ADD_FAILURE() << v;
}

// ---------------------------------------------------------------- suites without the command line
TEST(AppSuites, AccountSuiteMatchesTheCommand) {
  const std::string cfg = "n_layer=2,d_model=128,head_dim=32,vocab=256,seq_len=64";
  AccountOptions opt;
  opt.method = "dense";
  opt.config = cfg;
  opt.context = 100;
  opt.audit = true;
  AccountResult r = run_account(opt);
  ASSERT_NE(r.method, nullptr);
  EXPECT_EQ(r.method->name, "dense");
  EXPECT_EQ(r.query.T, 64);
  EXPECT_EQ(r.query.context, 100);
  EXPECT_EQ(r.row["status"], "ok");
  EXPECT_EQ(r.row["params"]["total"].get<int64_t>(), r.cost.params.total());
  EXPECT_EQ(r.row["layers"].size(), 2u);
  EXPECT_TRUE(r.row["audit"]["params_match"].get<bool>());
  EXPECT_LT(r.row["audit"]["fwd_flops_rel_diff"].get<double>(), 0.02);
  EXPECT_TRUE(r.audit_passed());
  // the command's report holds exactly the suite's row
  const fs::path out = app_tmp("account.json");
  testing::internal::CaptureStdout();
  ASSERT_EQ(run_cli({"account", "--method", "dense", "--config", cfg, "--context", "100", "--audit", "--out", out.string()}), 0);
  testing::internal::GetCapturedStdout();
  EXPECT_EQ(Json::parse(read_file(out.string()))["results"][0], r.row);
  // without an audit there is no audit block, and it passes
  opt.audit = false;
  opt.context.reset();
  AccountResult plain = run_account(opt);
  EXPECT_FALSE(plain.row.contains("audit"));
  EXPECT_EQ(plain.query.context, 64);
  EXPECT_TRUE(plain.audit_passed());
  // a failed audit is reported as such
  plain.row["audit"] = {{"params_match", true}, {"fwd_flops_rel_diff", 0.05}};
  EXPECT_FALSE(plain.audit_passed());
  plain.row["audit"] = {{"params_match", false}, {"fwd_flops_rel_diff", 0.0}};
  EXPECT_FALSE(plain.audit_passed());
  opt.method = "dense_ful";
  EXPECT_THROW(run_account(opt), UsageError);
}

TEST(AppSuites, GoldenWriteThenRead) {
  GoldenRequest req;
  req.op = "attention";
  req.config = "H=4,Hkv=2,D=8,window=5";
  req.batch = 2;
  req.seq_len = 9;
  req.seed = 3;
  const fs::path p = app_tmp("attn.safetensors");
  const SafetensorsFile made = make_golden(req);
  EXPECT_EQ(write_golden(req, p.string()), made.tensors.size());
  EXPECT_EQ(made.metadata.at("op"), "attention");
  EXPECT_EQ(made.metadata.at("window"), "5");
  for (const char* t : {"q", "k", "v", "o", "do", "grad_q", "grad_k", "grad_v"}) EXPECT_TRUE(made.tensors.has(t)) << t;
  const GoldenFile g = read_golden(p.string());
  ASSERT_NE(g.op, nullptr);
  EXPECT_EQ(g.op->name, "attention");
  EXPECT_EQ(g.config.i("window"), 5);
  EXPECT_EQ(g.dtype, "fp64");
  EXPECT_TRUE(at::equal(g.inputs.at("q"), made.tensors.at("q").to(at::kDouble)));
  EXPECT_TRUE(at::equal(g.cotangents.at("o"), made.tensors.at("do")));
  EXPECT_EQ(g.inputs.at("q").size(0), 2);
  // the same request gives the same file
  EXPECT_TRUE(at::equal(make_golden(req).tensors.at("grad_k"), made.tensors.at("grad_k")));
  // problems name the file
  TensorMap no_q;
  for (const auto& [n, t] : made.tensors)
    if (n != "q") no_q.set(n, t);
  const fs::path bad = app_tmp("no_q.safetensors");
  write_safetensors(bad.string(), no_q, made.metadata);
  try {
    read_golden(bad.string());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_TRUE(has(e.what(), "golden file '" + bad.string() + "': missing input tensor 'q'")) << e.what();
  }
  const fs::path no_op = app_tmp("no_op.safetensors");
  write_safetensors(no_op.string(), made.tensors, {{"window", "5"}});
  EXPECT_THROW(read_golden(no_op.string()), InputError);
}

// ---------------------------------------------------------------- HTML pages
TEST(AppReports, HtmlHelpers) {
  EXPECT_EQ(html_escape(R"(<a href="x">&amp;</a> ok)"), "&lt;a href=&quot;x&quot;&gt;&amp;amp;&lt;/a&gt; ok");
  EXPECT_STREQ(series_colour(0, SeriesOrder::Sweep), "#1f77b4");
  EXPECT_STREQ(series_colour(3, SeriesOrder::Sweep), "#9467bd");
  EXPECT_STREQ(series_colour(3, SeriesOrder::Leaderboard), "#ff7f0e");
  EXPECT_STREQ(series_colour(13, SeriesOrder::Leaderboard), series_colour(3, SeriesOrder::Leaderboard));
  std::set<std::string> sweep, board;
  for (size_t i = 0; i < 10; ++i) {
    sweep.insert(series_colour(i, SeriesOrder::Sweep));
    board.insert(series_colour(i, SeriesOrder::Leaderboard));
  }
  EXPECT_EQ(sweep.size(), 10u);
  EXPECT_EQ(sweep, board);
  EXPECT_EQ(svg_open(860, 520, R"( font-size="12")"),
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"520\" viewBox=\"0 0 860 520\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n");
}

namespace {
const char* kPinnedSweepReport = R"JSON({
  "kind": "sweep", "command": "mixbench sweep --mode prefill", "created": "2026-01-01T00:00:00Z",
  "git_commit": "0123456789abcdef", "machine": {"cpu": "Test CPU <x86>", "gpu": "Test GPU"},
  "config": {"mode": "prefill", "level": "model", "device": "cpu", "dtype": "fp32", "optimizer": "sgd & co"},
  "results": [
    {"method": "dense", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 51234.5},
    {"method": "dense", "status": "ok", "shape": {"B": 1, "T": 256}, "tokens_per_s": 40321.25},
    {"method": "dense", "status": "oom", "shape": {"B": 1, "T": 512}, "last_fit_T": 256},
    {"method": "dense", "status": "ok", "shape": {"B": 2, "T": 128}, "tokens_per_s": 90000},
    {"method": "dense", "status": "ok", "shape": {"B": 2, "T": 256}, "tokens_per_s": 70001},
    {"method": "gla", "op": "gla_chunk", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 12345.678},
    {"method": "gla", "op": "gla_chunk", "status": "ok", "shape": {"B": 1, "T": 512}, "tokens_per_s": 23456.789},
    {"method": "a<b>&\"c", "status": "ok", "shape": {"B": 1, "T": 256}, "tokens_per_s": 999.5},
    {"method": "m4", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 5},
    {"method": "m5", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 6},
    {"method": "m6", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 7},
    {"method": "m7", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 8},
    {"method": "m8", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 9},
    {"method": "m9", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 10},
    {"method": "m10", "status": "ok", "shape": {"B": 1, "T": 128}, "tokens_per_s": 11},
    {"method": "skipped_one", "status": "skipped", "reason": "no <cuda> path"},
    {"method": "broken", "status": "error", "shape": {"B": 1, "T": 128}, "message": "boom & bust"}
  ]})JSON";

const char* kPinnedLeaderboardResults = R"JSON([
  {"status": "ok", "method": "dense", "loss_curve": [5.5, 4.25, 3.5, 3.0, 2.75], "steps": 5, "tokens": 640,
   "train_flops_per_token_nanochat": 1.5e6, "val_bpb": 3.25},
  {"status": "ok", "method": "gla<&>", "loss_curve": [5.0, 4.5, 3.75, 3.25, 2.5], "steps": 5, "tokens": 640,
   "train_flops_per_token_nanochat": 1.52e6, "val_bpb": 3.125},
  {"status": "ok", "method": "m3", "loss_curve": [6.0, 5.0], "steps": 2, "tokens": 256,
   "train_flops_per_token_nanochat": 1.49e6, "val_bits_per_token": 4.5},
  {"status": "ok", "method": "m4", "loss_curve": [6.5], "steps": 1, "tokens": 128,
   "train_flops_per_token_nanochat": 1.48e6, "val_bpb": 4.0},
  {"status": "ok", "method": "m5", "loss_curve": [], "steps": 0, "tokens": 0,
   "train_flops_per_token_nanochat": 1.51e6},
  {"status": "error", "method": "failed", "message": "out of memory"}
])JSON";
const char* kPinnedLeaderboardTitle = "mixbench leaderboard, preset <tiny> & \"more\"";
const char* kPinnedLeaderboardSummary = R"JSON({"baseline": "dense", "seeds": 1})JSON";
}  // namespace

// The pages' exact bytes for fixed inputs (FNV-1a of the text): a change to either page's markup
// shows here.
TEST(AppReports, PagesKeepTheirBytes) {
  const std::string sweep = render_sweep_html(Json::parse(kPinnedSweepReport));
  EXPECT_EQ(sweep.size(), 9064u);
  EXPECT_EQ(fnv1a_hex(sweep), "8d38b77fe4c971c1");
  EXPECT_TRUE(has(sweep, "a&lt;b&gt;&amp;&quot;c"));
  const std::string board =
      leaderboard_html(Json::parse(kPinnedLeaderboardResults), kPinnedLeaderboardTitle, Json::parse(kPinnedLeaderboardSummary));
  EXPECT_EQ(board.size(), 14818u);
  EXPECT_EQ(fnv1a_hex(board), "1570d9e3b9508f06");
  EXPECT_TRUE(has(board, "gla&lt;&amp;&gt;"));
}
