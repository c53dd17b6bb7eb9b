// A per-seed train result as run_leaderboard collects it, for the leaderboard's table, statistics and
// page tests: `steps` steps of 64 tokens each with the first `steps` entries of one loss curve.
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace mixbench_test {

inline nlohmann::json leaderboard_run_row(const std::string& method, uint64_t seed, double bpb, double tps,
                                          double flops_per_token, int64_t steps) {
  const std::vector<double> curve = {5.0, 4.0, 3.5, 3.25};
  return {{"status", "ok"},
          {"method", method},
          {"seed", seed},
          {"val_bpb", bpb},
          {"tokens_per_s", tps},
          {"seconds", 2.0},
          {"steps", steps},
          {"tokens", 64 * steps},
          {"loss_curve", std::vector<double>(curve.begin(), curve.begin() + std::min<int64_t>(steps, 4))},
          {"train_flops_per_token_nanochat", flops_per_token},
          {"params", {{"total", 1000}, {"matmul", 800}}}};
}

}  // namespace mixbench_test
