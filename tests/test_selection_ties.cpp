// Selections that tie: a top-k selection that differs from the reference's only among keys whose
// reference score ties the k-th score (within the dtype's tolerance) is accepted and counted as tie
// swaps; a selection that drops a key strictly above the boundary still fails. Also through a
// golden file of dsa_indexer whose selection keeps other tied keys (as FLA's torch.topk does).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>
#include <unistd.h>

#include "harness/cli/cli.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "suites/conformance_checks.h"
#include "suites/golden.h"

namespace fs = std::filesystem;
using namespace mixbench;
using namespace mixbench::conformance_detail;

namespace {
at::Tensor longs(std::vector<int64_t> v, std::vector<int64_t> shape) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).view(shape);
}
at::Tensor doubles(std::vector<double> v, std::vector<int64_t> shape) {
  return at::tensor(v, at::TensorOptions().dtype(at::kDouble)).view(shape);
}
fs::path tmp(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mixbench_selection_ties_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / name;
}
}  // namespace

// ReLU scores tied at zero at the k-th place: the stable sort keeps key 1, a top-k keeping the last
// tied key (or whatever torch.topk keeps) is as correct; dropping key 6 (score 2 > 0) is not.
TEST(SelectionTies, TiedAtZeroPassesAStrictGapFails) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor scores = doubles({5, 0, 0, 3, 0, 0, 2, 0, /*row 2*/ 1, 4, -inf, -inf, -inf, -inf, -inf, -inf}, {2, 8});
  const at::Tensor ref = longs({0, 3, 6, 1, /*row 2*/ 1, 0, -1, -1}, {2, 4});
  const at::Tensor last_tied = longs({7, 6, 3, 0, 0, 1, -1, -1}, {2, 4});
  SelectionComparison s = compare_selection_ties(ref, last_tied, scores, 1e-12);
  EXPECT_EQ(s.cmp.rel_rms, 0.0);
  EXPECT_EQ(s.tie_swaps, 1);
  EXPECT_GT(compare_selection(ref, last_tied).rel_rms, 0.0) << "the sets differ: only the tie rule accepts them";

  // torch.topk's own choice among the tied keys
  at::Tensor topk = std::get<1>(at::topk(scores.slice(0, 0, 1), 4));
  at::Tensor topk_rows = at::cat({topk, ref.slice(0, 1, 2)});
  EXPECT_EQ(compare_selection_ties(ref, topk_rows, scores, 1e-12).cmp.rel_rms, 0.0);

  // a key strictly above the boundary swapped for a tied one fails the row
  const at::Tensor strict = longs({0, 3, 1, 2, 1, 0, -1, -1}, {2, 4});
  s = compare_selection_ties(ref, strict, scores, 1e-12);
  EXPECT_EQ(s.cmp.rel_rms, 0.5);
  EXPECT_EQ(s.cmp.max_abs, 1.0);
  EXPECT_EQ(s.tie_swaps, 0);
  Json c = selection_check("indices", ref, strict, scores, 1e-12);
  EXPECT_EQ(c["status"], "fail");
  EXPECT_EQ(c["tie_swaps"], 0);
  c = selection_check("indices", ref, last_tied, scores, 1e-12);
  EXPECT_EQ(c["status"], "pass");
  EXPECT_EQ(c["tie_swaps"], 1);
  // without scores the comparison stays exact
  EXPECT_EQ(selection_check("indices", ref, last_tied, at::Tensor(), 1e-12)["status"], "fail");
  EXPECT_FALSE(selection_check("indices", ref, last_tied, at::Tensor(), 1e-12).contains("tie_swaps"));

  // a non-candidate key (−inf), a repeated key or a missing one fails even among ties
  EXPECT_EQ(compare_selection_ties(ref, longs({0, 3, 6, 1, 1, 2, -1, -1}, {2, 4}), scores, 1e-12).cmp.rel_rms, 0.5);
  EXPECT_EQ(compare_selection_ties(ref, longs({0, 3, 6, 6, 1, 0, -1, -1}, {2, 4}), scores, 1e-12).cmp.rel_rms, 0.5);
  EXPECT_EQ(compare_selection_ties(ref, longs({0, 3, 6, -1, 1, 0, -1, -1}, {2, 4}), scores, 1e-12).cmp.rel_rms, 0.5);
}

// The tolerance is relative to the row's largest score: a near-tie within 1e-12 passes at fp64, one
// of 1e-9 only at a dtype whose tolerance covers it.
TEST(SelectionTies, ToleranceFollowsTheDtype) {
  const at::Tensor scores = doubles({10, 1, 1 - 1e-12, 1 - 1e-8}, {1, 4});
  const at::Tensor ref = longs({0, 1}, {1, 2});
  EXPECT_EQ(compare_selection_ties(ref, longs({0, 2}, {1, 2}), scores, tie_tolerance("fp64")).cmp.rel_rms, 0.0);
  EXPECT_EQ(compare_selection_ties(ref, longs({0, 3}, {1, 2}), scores, tie_tolerance("fp64")).cmp.rel_rms, 1.0);
  EXPECT_EQ(compare_selection_ties(ref, longs({0, 3}, {1, 2}), scores, tie_tolerance("fp32")).cmp.rel_rms, 0.0);
  EXPECT_EQ(tie_tolerance("fp64"), 1e-12);
}

// A golden file of dsa_indexer whose indices keep the highest-index keys among those tied with the
// k-th score (ReLU zeros), where the reference keeps the lowest: `conformance --golden` passes and
// reports the tie swaps; the same file with a key above the boundary exchanged fails.
TEST(SelectionTies, GoldenWithOtherTiedKeysPasses) {
  const fs::path ref_path = tmp("dsa_ref.safetensors");
  GoldenRequest req;
  req.op = "dsa_indexer";
  req.config = "HI=1,DI=4,topk=4";  // one ReLU'd head: about half the scores are exactly 0
  req.batch = 2;
  req.seq_len = 33;
  req.seed = 5;
  write_golden(req, ref_path.string());
  const GoldenFile g = read_golden(ref_path.string());
  const std::string key = g.file.tensors.has("indices") ? "indices" : "expected_indices";
  const at::Tensor want = g.file.tensors.at(key);
  const at::Tensor scores = g.op->selection_scores(g.inputs, g.config).at("indices");

  at::Tensor tied = want.clone(), strict = want.clone();
  int64_t swaps = 0, strict_rows = 0;
  auto sel = tied.accessor<int64_t, 3>();
  auto bad = strict.accessor<int64_t, 3>();
  auto sc = scores.accessor<double, 3>();
  for (int64_t b = 0; b < want.size(0); ++b)
    for (int64_t t = 0; t < want.size(1); ++t) {
      std::vector<int64_t> slots;
      double kth = std::numeric_limits<double>::infinity(), top = -kth;
      for (int64_t j = 0; j < want.size(2); ++j)
        if (sel[b][t][j] >= 0) {
          slots.push_back(j);
          kth = std::min(kth, sc[b][t][sel[b][t][j]]);
          top = std::max(top, sc[b][t][sel[b][t][j]]);
        }
      // the keys tied with the boundary, selected or not; the selection takes the highest ones
      std::vector<int64_t> tied_keys, tied_slots;
      std::set<int64_t> chosen;
      for (int64_t j : slots) chosen.insert(sel[b][t][j]);
      for (int64_t s = 0; s <= t; ++s)
        if (sc[b][t][s] == kth) tied_keys.push_back(s);
      for (int64_t j : slots)
        if (sc[b][t][sel[b][t][j]] == kth) tied_slots.push_back(j);
      for (size_t i = 0; i < tied_slots.size(); ++i) {
        const int64_t k = tied_keys[tied_keys.size() - 1 - i];
        if (!chosen.count(k)) ++swaps;
        sel[b][t][tied_slots[i]] = k;
      }
      // strict: the row's top key (above the boundary) exchanged for an unselected key
      if (top > kth && int64_t(slots.size()) < t + 1) {
        for (int64_t s = 0; s <= t; ++s)
          if (!chosen.count(s)) {
            for (int64_t j : slots)
              if (sc[b][t][bad[b][t][j]] == top) {
                bad[b][t][j] = s;
                break;
              }
            ++strict_rows;
            break;
          }
      }
    }
  ASSERT_GT(swaps, 0) << "the inputs must tie at the boundary";
  ASSERT_GT(strict_rows, 0);

  auto write_with = [&](const std::string& name, const at::Tensor& indices) {
    TensorMap t;
    for (const auto& [n, x] : g.file.tensors) t.set(n, n == key ? indices : x);
    const fs::path p = tmp(name);
    write_safetensors(p.string(), t, g.file.metadata);
    return p;
  };
  const fs::path tied_path = write_with("dsa_tied.safetensors", tied);
  const fs::path strict_path = write_with("dsa_strict.safetensors", strict);
  const fs::path rep = tmp("report.json");
  testing::internal::CaptureStdout();
  const int rc_tied = run_cli({"conformance", "--golden", tied_path.string(), "--out", rep.string(), "--quiet"});
  const int rc_strict = run_cli({"conformance", "--golden", strict_path.string(), "--quiet"});
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc_tied, 0) << out;
  EXPECT_EQ(rc_strict, 1) << out;
  const Json r = Json::parse(read_file(rep.string()));
  int64_t reported = -1;
  for (const auto& res : r["results"])
    if (res["backend"] == "reference")
      for (const auto& c : res["checks"])
        if (c["kind"] == "selection") reported = c["tie_swaps"].get<int64_t>();
  EXPECT_EQ(reported, swaps);
  for (const fs::path& p : {ref_path, tied_path, strict_path, rep}) fs::remove(p);
  fs::remove(ref_path.parent_path());
}
