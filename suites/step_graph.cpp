#include "suites/step_graph.h"

#include <optional>
#include <stdexcept>

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace mixbench {

std::string step_dependence(const Model& m, int64_t it) {
  for (const Config& lc : m.layer_cfgs) {
    if (lc.has("full_attention_warmup_steps") && it < lc.i("full_attention_warmup_steps"))
      return "the full-attention warm-up (the layers depend on the step)";
    if (lc.has("mean_loops")) return "a loop depth sampled per step (no graph replays it)";
  }
  return "";
}

#if defined(MIXBENCH_WITH_CUDA)
struct StepGraph::Impl {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::optional<c10::cuda::CUDAStream> side;
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

void StepGraph::warm_up(const std::function<void()>& warmup) {
  impl_->side = c10::cuda::getStreamFromPool();
  cudaDeviceSynchronize();
  {
    c10::cuda::CUDAStreamGuard sg(*impl_->side);
    warmup();
  }
  cudaDeviceSynchronize();
}

std::string StepGraph::capture(const std::function<void()>& body, const std::function<void()>& undo) {
  if (!impl_->side) impl_->side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDACachingAllocator::emptyCache();
  impl_->graph = std::make_unique<at::cuda::CUDAGraph>();
  c10::cuda::CUDAStreamGuard sg(*impl_->side);  // capture_end, on success or failure, runs on the capture stream
  try {
    impl_->graph->capture_begin();
    body();
    impl_->graph->capture_end();
    return std::string();
  } catch (const std::exception& e) {
    try {
      impl_->graph->capture_end();  // ends an invalidated capture (and throws about it)
    } catch (const std::exception&) {
    }
    (void)cudaGetLastError();
    impl_->graph.reset();
    undo();
    c10::cuda::CUDACachingAllocator::emptyCache();  // what follows gets the failed capture's memory
    const std::string what = e.what();
    return what.substr(0, what.find('\n'));
  }
}

void StepGraph::replay() {
  if (!impl_->graph) throw std::logic_error("StepGraph::replay without a captured graph");
  impl_->graph->replay();
}
void StepGraph::reset() { impl_->graph.reset(); }
bool StepGraph::held() const { return impl_->graph != nullptr; }
#else
struct StepGraph::Impl {};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;
void StepGraph::warm_up(const std::function<void()>& warmup) { warmup(); }
std::string StepGraph::capture(const std::function<void()>&, const std::function<void()>& undo) {
  undo();
  return "built without CUDA";
}
void StepGraph::replay() { throw std::logic_error("StepGraph::replay without a captured graph"); }
void StepGraph::reset() {}
bool StepGraph::held() const { return false; }
#endif

}  // namespace mixbench
