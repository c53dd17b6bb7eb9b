// The execution plan of a model: which parameter block runs at each step of the forward pass.
// A plain stack applies block i once at step i; a looped (recurrent-depth) model applies a block
// several times, each application with its own decode-cache slot and its iteration index. The
// backbone runs embed → for each step: block(step) → head, and the accountant and the FLOP audit
// follow the same steps (FLOPs per application, parameters per block).
//
// Auxiliary routes: after the model's own steps (route 0) a plan may list further passes over the
// same blocks from the embedding (route 1, 2, …; e.g. a shorter schedule of a looped model whose
// read-out feeds an auxiliary training loss). They only serve auxiliary losses: model_forward runs
// them when its caller collects those (ModelAux: the training loss, conformance, goldens), prefill
// and decode never; they take no decode-cache slot (slot −1). The residual stream sees each step's
// route (Sublayer::route) and decides what an auxiliary route reads and where its result goes. The
// accountant bills them to training FLOPs (ModelCost::aux_route_fwd_flops), not to an inference
// forward or decode step.
#pragma once
#include <cstdint>
#include <vector>

namespace mixbench {

struct PlanStep {
  int64_t block = 0;         // parameter block "layers.<block>." (mixer + MLP)
  int64_t slot = 0;          // decode-cache slot this application fills and reads (−1: an auxiliary route's)
  int64_t iteration = 0;     // which application of this block in its route (0 = the first)
  int64_t n_iterations = 1;  // how many times the step's route applies this block
  int64_t route = 0;         // 0: the model's route; r > 0: auxiliary route r (see above)
};

struct ExecPlan {
  int64_t n_blocks = 0;  // parameter blocks (layers.0 … layers.<n_blocks−1>)
  int64_t n_slots = 0;   // decode-cache slots
  std::vector<PlanStep> steps;

  int64_t n_steps() const { return int64_t(steps.size()); }
  bool has_aux_routes() const { return !steps.empty() && steps.back().route > 0; }
  // Where plan step `step` sits in its route: its index there and the route's step count (for a
  // plan without auxiliary routes, the step itself and n_steps()).
  struct RoutePos {
    int64_t index = 0, length = 0;
  };
  RoutePos route_pos(int64_t step) const;
  // Appends an auxiliary route (the next route number) that applies `blocks` in this order, from the
  // embedding; its steps take no cache slot and count their iterations within the route.
  void add_route(const std::vector<int64_t>& blocks);
  // Block i at step i, slot i, once: the plain n_layer stack.
  static ExecPlan stack(int64_t n_layer);
  // A plan from the block order of its steps ({0, 1, 1, 1, 2}: block 1 three times): slots in step
  // order, iterations counted per block.
  static ExecPlan from_blocks(int64_t n_blocks, const std::vector<int64_t>& blocks);
  // A looped model of n_blocks blocks: the first n_prelude once, the middle (core) blocks
  // n_loops times in order (core, core, …), the last n_coda once. InputError when n_loops ≤ 0,
  // a split is negative, or the prelude and coda leave no core block.
  static ExecPlan loop(int64_t n_blocks, int64_t n_prelude, int64_t n_coda, int64_t n_loops);
  // InputError when a step names a block or slot out of range, a block is never applied by the
  // model's route, two steps share a slot, an auxiliary step has a slot, the routes are not in
  // order (route 0 first, then 1, 2, … each in one run), or iteration counts are inconsistent.
  void validate() const;
};

}  // namespace mixbench
