// Google Benchmark iterations timed on the GPU: CUDA events around each call of `run` on the current
// stream, the elapsed time reported as the iteration's manual time (register with UseManualTime()).
#pragma once
#include <ATen/cuda/CUDAContext.h>
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

namespace mixbench_bench {

template <class Run>
void time_cuda_iterations(benchmark::State& state, Run&& run) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (auto _ : state) {
    cudaEventRecord(a, at::cuda::getCurrentCUDAStream());
    run();
    cudaEventRecord(b, at::cuda::getCurrentCUDAStream());
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

}  // namespace mixbench_bench
