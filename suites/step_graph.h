// A training step captured once in a CUDA graph and replayed, the trainer's (suites/train.h) and
// the task suite's (suites/tasks.h): the capture stream, the warm-up pass before a capture, the
// capture with its clean-up when the step cannot be captured, and the rule for which steps depend
// on the step index in a way a replay cannot follow. The caller owns the static buffers the step
// reads (the batch) and writes (losses, gradients, parameters, optimizer state) and the device
// scalars its optimizer reads (suites/optimizer.h).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "harness/backbone.h"

namespace mixbench {

// Why step `it` of `m` cannot be replayed from a graph captured at another step ("" when it can):
// a layer in its full-attention warm-up (the sparse methods: the layers read Model::step), or a
// loop depth sampled per step (no graph replays it).
std::string step_dependence(const Model& m, int64_t it);

// One captured step. Without CUDA in the build, capture() returns a reason and nothing is held.
class StepGraph {
 public:
  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs `warmup` once on a fresh side stream (the stream the capture then uses), between two
  // device synchronisations: the kernels' lazy initialisation (cuBLAS handles and workspaces,
  // constants made once per device) happens outside the capture. Whatever it leaves (gradients)
  // is the caller's to clear before capture().
  void warm_up(const std::function<void()>& warmup);
  // Hands the caching allocator's free blocks back (the graph allocates from its own pool, so a
  // step that needs much of the card's memory can still be captured), then captures `body` on the
  // side stream. Returns "" when the graph is held, else the error's first line: the capture is
  // ended, the CUDA error cleared, nothing held, `undo` run (clear what the body made: gradients,
  // loss tensors) and the free blocks handed back again.
  std::string capture(const std::function<void()>& body, const std::function<void()>& undo);
  // Launches the captured kernels on the current stream.
  void replay();
  // Drops the graph (its pool lives on while tensors made in it do).
  void reset();
  bool held() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixbench
