// Decoding with the step captured in a CUDA graph: the model's static caches (ModelCache::capacity)
// stay where the graph reads them and the position lives on the device, so one capture replays at
// every position. The captured step is the whole token: embedding, every layer, the head, and the
// greedy argmax written back into the input buffer (a caller may overwrite the input before the
// next step to force other tokens).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/backbone.h"

namespace mixbench {

// A piece of device work run eagerly and captured in a CUDA graph on one side stream of a GPU (a
// capture cannot use the default stream): run() calls it on that stream and waits for it (the warm-up
// before a capture: constants, workspaces and the allocator's blocks settle); capture() records it
// without running it; replay() launches the recording, on the tensors it captured, on the caller's
// current stream (work queued after it on that stream sees its results). Throws
// std::runtime_error with the reason when the capture fails (a host read, an allocation the graph
// cannot replay, ...), UsageError without a CUDA build.
// The nodes of a captured CUDA graph by kind: what one replay launches.
struct GraphNodes {
  int64_t kernels = 0, memsets = 0, memcpys = 0, other = 0;
  std::vector<std::string> kernel_names;  // in node order; "" where the runtime cannot name one
  int64_t launches() const { return kernels + memsets + memcpys; }
};

class CapturedWork {
 public:
  explicit CapturedWork(int device);  // device < 0: the current one
  ~CapturedWork();
  CapturedWork(const CapturedWork&) = delete;
  CapturedWork& operator=(const CapturedWork&) = delete;
  void run(const std::function<void()>& work);
  void capture(const std::function<void()>& work);
  void replay();
  // The nodes of the last capture (all zero before one).
  const GraphNodes& nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class DecodeGraph {
 public:
  // `cache`: filled by model_prefill(m, idx, Backend::CUDA, &cache, capacity); `first` [B,1] int64:
  // the token at the cache's position. Runs that step eagerly on the capture stream (the warm-up:
  // its logits are logits(), its greedy token becomes the input), then captures one step. The
  // model and the cache must outlive the graph. Throws std::runtime_error with the reason when the
  // capture fails (a host read, an allocation the graph cannot replay, ...).
  DecodeGraph(const Model& m, ModelCache& cache, const at::Tensor& first);
  ~DecodeGraph();
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;
  // One token per row: replays the step on the input buffer; the host position advances. Throws
  // InputError when the cache is full.
  void step();
  // After a new prefill into the same static cache (same batch size and capacity): the next step
  // reads `first` at the new position.
  void restart(const at::Tensor& first);
  // The [B,1] tokens the next step reads (the last step's greedy tokens unless overwritten).
  at::Tensor& input();
  // The last step's logits [B,1,vocab].
  const at::Tensor& logits() const;
  // The nodes of the captured step (its kernels: the launches one token costs, the greedy argmax
  // and its copy into the input included).
  const GraphNodes& nodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixbench
