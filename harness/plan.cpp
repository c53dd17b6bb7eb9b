#include "harness/plan.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "harness/errors.h"

namespace mixbench {

ExecPlan ExecPlan::stack(int64_t n_layer) {
  ExecPlan p;
  p.n_blocks = n_layer;
  p.n_slots = n_layer;
  for (int64_t i = 0; i < n_layer; ++i) p.steps.push_back({i, i, 0, 1});
  return p;
}

ExecPlan ExecPlan::from_blocks(int64_t n_blocks, const std::vector<int64_t>& blocks) {
  ExecPlan p;
  p.n_blocks = n_blocks;
  p.n_slots = int64_t(blocks.size());
  std::map<int64_t, int64_t> count, seen;
  for (int64_t b : blocks) ++count[b];
  for (size_t s = 0; s < blocks.size(); ++s) {
    const int64_t b = blocks[s];
    p.steps.push_back({b, int64_t(s), seen[b]++, count[b]});
  }
  p.validate();
  return p;
}

ExecPlan ExecPlan::loop(int64_t n_blocks, int64_t n_prelude, int64_t n_coda, int64_t n_loops) {
  if (n_loops < 1) throw InputError(fmt::format("n_loops {} must be at least 1", n_loops));
  if (n_prelude < 0 || n_coda < 0)
    throw InputError(fmt::format("n_prelude {} and n_coda {} must not be negative", n_prelude, n_coda));
  if (n_prelude + n_coda >= n_blocks)
    throw InputError(fmt::format("n_prelude {} + n_coda {} leave no core block of n_layer {}", n_prelude, n_coda,
                                 n_blocks));
  std::vector<int64_t> blocks;
  for (int64_t b = 0; b < n_prelude; ++b) blocks.push_back(b);
  for (int64_t r = 0; r < n_loops; ++r)
    for (int64_t b = n_prelude; b < n_blocks - n_coda; ++b) blocks.push_back(b);
  for (int64_t b = n_blocks - n_coda; b < n_blocks; ++b) blocks.push_back(b);
  return from_blocks(n_blocks, blocks);
}

void ExecPlan::validate() const {
  if (n_blocks < 1) throw InputError(fmt::format("execution plan: {} parameter blocks (needs at least 1)", n_blocks));
  if (steps.empty()) throw InputError("execution plan has no steps");
  std::set<int64_t> slots;
  std::map<int64_t, std::vector<const PlanStep*>> per_block;
  for (size_t s = 0; s < steps.size(); ++s) {
    const PlanStep& st = steps[s];
    if (st.block < 0 || st.block >= n_blocks)
      throw InputError(fmt::format("execution plan step {} names block {} (blocks 0..{})", s, st.block, n_blocks - 1));
    if (st.slot < 0 || st.slot >= n_slots)
      throw InputError(fmt::format("execution plan step {} names cache slot {} (slots 0..{})", s, st.slot, n_slots - 1));
    if (!slots.insert(st.slot).second)
      throw InputError(fmt::format("execution plan step {} reuses cache slot {}", s, st.slot));
    per_block[st.block].push_back(&st);
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    auto it = per_block.find(b);
    if (it == per_block.end()) throw InputError(fmt::format("execution plan never applies block {}", b));
    const auto& apps = it->second;
    for (size_t k = 0; k < apps.size(); ++k)
      if (apps[k]->iteration != int64_t(k) || apps[k]->n_iterations != int64_t(apps.size()))
        throw InputError(fmt::format("execution plan: application {} of block {} says iteration {} of {} (expected {} of {})",
                                     k, b, apps[k]->iteration, apps[k]->n_iterations, k, apps.size()));
  }
}

}  // namespace mixbench
