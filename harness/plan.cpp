#include "harness/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

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

ExecPlan::RoutePos ExecPlan::route_pos(int64_t step) const {
  if (step < 0 || step >= n_steps()) throw std::logic_error(fmt::format("route_pos: no plan step {}", step));
  const int64_t r = steps[size_t(step)].route;
  int64_t begin = step, end = step + 1;
  while (begin > 0 && steps[size_t(begin - 1)].route == r) --begin;
  while (end < n_steps() && steps[size_t(end)].route == r) ++end;
  return {step - begin, end - begin};
}

void ExecPlan::add_route(const std::vector<int64_t>& blocks) {
  if (blocks.empty()) throw InputError("an auxiliary route needs at least one step");
  const int64_t r = steps.empty() ? 1 : std::max<int64_t>(1, steps.back().route + 1);
  std::map<int64_t, int64_t> count, seen;
  for (int64_t b : blocks) ++count[b];
  for (int64_t b : blocks) steps.push_back({b, -1, seen[b]++, count[b], r});
  validate();
}

void ExecPlan::validate() const {
  if (n_blocks < 1) throw InputError(fmt::format("execution plan: {} parameter blocks (needs at least 1)", n_blocks));
  if (steps.empty()) throw InputError("execution plan has no steps");
  if (steps.front().route != 0) throw InputError("execution plan: the model's route (route 0) comes first");
  std::set<int64_t> slots;
  std::map<std::pair<int64_t, int64_t>, std::vector<const PlanStep*>> per_block;  // (route, block)
  for (size_t s = 0; s < steps.size(); ++s) {
    const PlanStep& st = steps[s];
    if (st.block < 0 || st.block >= n_blocks)
      throw InputError(fmt::format("execution plan step {} names block {} (blocks 0..{})", s, st.block, n_blocks - 1));
    if (s > 0 && st.route != steps[s - 1].route && st.route != steps[s - 1].route + 1)
      throw InputError(fmt::format("execution plan step {} is on route {} after route {} (routes in order, each in one run)",
                                   s, st.route, steps[s - 1].route));
    if (st.route > 0) {
      if (st.slot != -1)
        throw InputError(fmt::format("execution plan step {} of auxiliary route {} names cache slot {} (auxiliary routes take none)",
                                     s, st.route, st.slot));
    } else {
      if (st.slot < 0 || st.slot >= n_slots)
        throw InputError(fmt::format("execution plan step {} names cache slot {} (slots 0..{})", s, st.slot, n_slots - 1));
      if (!slots.insert(st.slot).second)
        throw InputError(fmt::format("execution plan step {} reuses cache slot {}", s, st.slot));
    }
    per_block[{st.route, st.block}].push_back(&st);
  }
  for (int64_t b = 0; b < n_blocks; ++b)
    if (!per_block.count({0, b})) throw InputError(fmt::format("execution plan never applies block {}", b));
  for (const auto& [key, apps] : per_block)
    for (size_t k = 0; k < apps.size(); ++k)
      if (apps[k]->iteration != int64_t(k) || apps[k]->n_iterations != int64_t(apps.size()))
        throw InputError(fmt::format("execution plan: application {} of block {} (route {}) says iteration {} of {} (expected {} of {})",
                                     k, key.second, key.first, apps[k]->iteration, apps[k]->n_iterations, k, apps.size()));
}

}  // namespace mixbench
