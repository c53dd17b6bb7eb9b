// The execution plan of a model: which parameter block runs at each step of the forward pass.
// A plain stack applies block i once at step i; a looped (recurrent-depth) model applies a block
// several times, each application with its own decode-cache slot and its iteration index. The
// backbone runs embed → for each step: block(step) → head, and the accountant and the FLOP audit
// follow the same steps (FLOPs per application, parameters per block).
#pragma once
#include <cstdint>
#include <vector>

namespace mixbench {

struct PlanStep {
  int64_t block = 0;         // parameter block "layers.<block>." (mixer + MLP)
  int64_t slot = 0;          // decode-cache slot this application fills and reads
  int64_t iteration = 0;     // which application of this block (0 = the first)
  int64_t n_iterations = 1;  // how many times the plan applies this block
};

struct ExecPlan {
  int64_t n_blocks = 0;  // parameter blocks (layers.0 … layers.<n_blocks−1>)
  int64_t n_slots = 0;   // decode-cache slots
  std::vector<PlanStep> steps;

  int64_t n_steps() const { return int64_t(steps.size()); }
  // Block i at step i, slot i, once: the plain n_layer stack.
  static ExecPlan stack(int64_t n_layer);
  // A plan from the block order of its steps ({0, 1, 1, 1, 2}: block 1 three times): slots in step
  // order, iterations counted per block.
  static ExecPlan from_blocks(int64_t n_blocks, const std::vector<int64_t>& blocks);
  // A looped model of n_blocks blocks: the first n_prelude once, the middle (core) blocks
  // n_loops times in order (core, core, …), the last n_coda once. InputError when n_loops ≤ 0,
  // a split is negative, or the prelude and coda leave no core block.
  static ExecPlan loop(int64_t n_blocks, int64_t n_prelude, int64_t n_coda, int64_t n_loops);
  // InputError when a step names a block or slot out of range, a block is never applied, two steps
  // share a slot, or iteration counts are inconsistent.
  void validate() const;
};

}  // namespace mixbench
