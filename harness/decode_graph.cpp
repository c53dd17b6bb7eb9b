#include "harness/decode_graph.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "harness/errors.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mixbench {

struct DecodeGraph::Impl {
  const Model* model = nullptr;
  ModelCache* cache = nullptr;
  at::Tensor input, logits;  // logits: the captured step's output buffer
  at::Tensor warm_logits;     // the warm-up step's, until the first replay
  bool replayed = false;
#if defined(MIXBENCH_WITH_CUDA)
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

namespace {
void check_first(const at::Tensor& first, const ModelCache& cache) {
  if (!cache.capacity || !cache.pos_dev.defined())
    throw UsageError("a captured decode step needs a static cache (model_prefill with a capacity)");
  if (first.dim() != 2 || first.size(1) != 1 || first.scalar_type() != at::kLong || first.device() != cache.pos_dev.device() ||
      first.size(0) != cache.prev_embed.size(0))
    throw InputError("a captured decode step takes the first tokens as int64 [B,1] on the cache's device");
}
}  // namespace

DecodeGraph::DecodeGraph(const Model& m, ModelCache& cache, const at::Tensor& first) : impl_(std::make_unique<Impl>()) {
#if defined(MIXBENCH_WITH_CUDA)
  check_first(first, cache);
  if (!first.is_cuda()) throw UsageError("a captured decode step runs on CUDA");
  if (cache.pos + 1 >= cache.capacity)  // the warm-up step and one more
    throw InputError(fmt::format("the static cache ({} tokens) is full at position {}", cache.capacity, cache.pos));
  c10::NoGradGuard ng;
  impl_->model = &m;
  impl_->cache = &cache;
  impl_->input = first.clone();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, first.device().index());
  auto one_step = [this] {
    impl_->logits = model_decode_step(*impl_->model, impl_->input, *impl_->cache, Backend::CUDA);
    impl_->input.copy_(impl_->logits.argmax(-1));
  };
  c10::cuda::getCurrentCUDAStream(first.device().index()).synchronize();
  {
    c10::cuda::CUDAStreamGuard sg(side);
    one_step();  // the warm-up: a real step (constants, workspaces and the allocator's blocks settle)
  }
  side.synchronize();
  impl_->warm_logits = impl_->logits;  // the capture below rebinds logits to the graph's output buffer
  impl_->graph = std::make_unique<at::cuda::CUDAGraph>();
  const int64_t pos = cache.pos;
  try {
    c10::cuda::CUDAStreamGuard sg(side);
    impl_->graph->capture_begin();
    one_step();
    impl_->graph->capture_end();
  } catch (const std::exception& e) {
    try {
      impl_->graph->capture_end();
    } catch (const std::exception&) {
    }
    (void)cudaGetLastError();
    impl_->graph.reset();
    cache.pos = pos;
    const std::string what = e.what();
    throw std::runtime_error("decode step capture failed: " + what.substr(0, what.find('\n')));
  }
  cache.pos = pos;  // the capture recorded the step without running it
#else
  (void)m;
  (void)cache;
  (void)first;
  throw UsageError("a captured decode step needs a CUDA build");
#endif
}

DecodeGraph::~DecodeGraph() = default;

void DecodeGraph::step() {
#if defined(MIXBENCH_WITH_CUDA)
  ModelCache& c = *impl_->cache;
  if (c.pos >= c.capacity)
    throw InputError(fmt::format("the static cache ({} tokens) is full at position {}", c.capacity, c.pos));
  impl_->graph->replay();
  impl_->replayed = true;
  impl_->warm_logits = at::Tensor();
  c.pos += 1;
#endif
}

void DecodeGraph::restart(const at::Tensor& first) {
  check_first(first, *impl_->cache);
  impl_->input.copy_(first);
}

at::Tensor& DecodeGraph::input() { return impl_->input; }

const at::Tensor& DecodeGraph::logits() const { return impl_->replayed ? impl_->logits : impl_->warm_logits; }

}  // namespace mixbench
