#include "harness/decode_graph.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "harness/decode_ops.h"
#include "harness/errors.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mixbench {

struct CapturedWork::Impl {
  GraphNodes nodes;
#if defined(MIXBENCH_WITH_CUDA)
  std::unique_ptr<c10::cuda::CUDAStream> side;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

CapturedWork::CapturedWork(int device) : impl_(std::make_unique<Impl>()) {
#if defined(MIXBENCH_WITH_CUDA)
  if (device < 0) device = c10::cuda::current_device();
  impl_->side = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(false, device));
  c10::cuda::getCurrentCUDAStream(device).synchronize();
#else
  (void)device;
  throw UsageError("a captured CUDA graph needs a CUDA build");
#endif
}

CapturedWork::~CapturedWork() = default;

void CapturedWork::run(const std::function<void()>& work) {
#if defined(MIXBENCH_WITH_CUDA)
  {
    c10::cuda::CUDAStreamGuard sg(*impl_->side);
    work();
  }
  impl_->side->synchronize();
#else
  (void)work;
#endif
}

#if defined(MIXBENCH_WITH_CUDA)
namespace {
GraphNodes count_nodes(cudaGraph_t g) {
  size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) throw std::runtime_error("cannot list the captured graph's nodes");
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0 && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess)
    throw std::runtime_error("cannot list the captured graph's nodes");
  GraphNodes c;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    if (cudaGraphNodeGetType(node, &t) != cudaSuccess) throw std::runtime_error("cannot read a captured node's type");
    if (t == cudaGraphNodeTypeKernel) {
      ++c.kernels;
      cudaKernelNodeParams kp{};
      const char* name = nullptr;
      if (cudaGraphKernelNodeGetParams(node, &kp) != cudaSuccess || cudaFuncGetName(&name, kp.func) != cudaSuccess)
        name = nullptr;
      (void)cudaGetLastError();  // a kernel the runtime cannot name (e.g. a library's): no name, no error
      c.kernel_names.push_back(name ? name : "");
    }
    else if (t == cudaGraphNodeTypeMemset) ++c.memsets;
    else if (t == cudaGraphNodeTypeMemcpy) ++c.memcpys;
    else ++c.other;
  }
  return c;
}
}  // namespace
#endif

void CapturedWork::capture(const std::function<void()>& work) {
#if defined(MIXBENCH_WITH_CUDA)
  // kept past capture_end so that its nodes can be counted, then instantiated here
  impl_->graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
  try {
    c10::cuda::CUDAStreamGuard sg(*impl_->side);
    impl_->graph->capture_begin();
    work();
    impl_->graph->capture_end();
    impl_->nodes = count_nodes(impl_->graph->raw_cuda_graph());
    impl_->graph->instantiate();
  } catch (const std::exception& e) {
    try {
      impl_->graph->capture_end();
    } catch (const std::exception&) {
    }
    (void)cudaGetLastError();
    impl_->graph.reset();
    const std::string what = e.what();
    throw std::runtime_error("capture failed: " + what.substr(0, what.find('\n')));
  }
#else
  (void)work;
#endif
}

const GraphNodes& CapturedWork::nodes() const { return impl_->nodes; }

void CapturedWork::replay() {
#if defined(MIXBENCH_WITH_CUDA)
  if (!impl_->graph) throw UsageError("nothing was captured to replay");
  impl_->graph->replay();
#endif
}

struct DecodeGraph::Impl {
  const Model* model = nullptr;
  ModelCache* cache = nullptr;
  at::Tensor input, logits;  // logits: the captured step's output buffer
  at::Tensor warm_logits;     // the warm-up step's, until the first replay
  GreedyScratch greedy;       // the greedy-token kernel's counters and partials (made by the warm-up step)
  bool replayed = false;
  std::unique_ptr<CapturedWork> work;
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
  impl_->input = first.clone(at::MemoryFormat::Contiguous);  // greedy tokens are stored into it
  auto one_step = [this] {
    impl_->logits = model_decode_step(*impl_->model, impl_->input, *impl_->cache, Backend::CUDA);
    greedy_tokens_into(impl_->logits, impl_->input, impl_->greedy);
  };
  impl_->work = std::make_unique<CapturedWork>(first.device().index());
  impl_->work->run(one_step);  // the warm-up: a real step
  impl_->warm_logits = impl_->logits;  // the capture below rebinds logits to the graph's output buffer
  const int64_t pos = cache.pos;
  try {
    impl_->work->capture(one_step);
  } catch (const std::exception& e) {
    cache.pos = pos;
    throw std::runtime_error(std::string("decode step ") + e.what());
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
  impl_->work->replay();
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

const GraphNodes& DecodeGraph::nodes() const { return impl_->work->nodes(); }

const at::Tensor& DecodeGraph::logits() const { return impl_->replayed ? impl_->logits : impl_->warm_logits; }

}  // namespace mixbench
