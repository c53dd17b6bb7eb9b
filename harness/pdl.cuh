// Programmatic dependent launches (Hopper and later) for a decode step's own kernels. A kernel
// launched through launch_dependent() may be scheduled while the kernel before it in the stream is
// still running: its first statement, pdl_wait(), blocks until that kernel has completed and its
// writes are visible (so it computes what an ordinary launch computes), then lets the kernel after
// it be scheduled at once. A captured decode step is a chain of short dependent kernels; this
// overlaps each one's launch with the end of the one before. MIXBENCH_DECODE_PDL=0 launches them
// ordinarily (harness/decode_knobs.h).
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "harness/decode_knobs.h"

namespace mixbench::cuda_launch {

// The first statement of every kernel launched through launch_dependent(): waits for the kernels
// before it, then releases the ones after it (which wait in turn for this one to complete).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch when enabled and
// the stream is capturing a graph.
// The kernel must call pdl_wait() before anything else. Throws std::runtime_error naming `what`.
template <class... KArgs, class... Args>
void launch_dependent(const char* what, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  // programmatic only into a CUDA graph being captured (the decode step's replays): an eager launch
  // is bound by the host anyway and stays an ordinary one
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": cannot query the stream's capture state");
  cfg.numAttrs = capture == cudaStreamCaptureStatusActive && decode_pdl_enabled() ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace mixbench::cuda_launch
