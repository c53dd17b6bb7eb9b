// Where a training step's time goes: a Kineto trace (LibTorch's profiler, the one torch.profiler
// drives) of a few steps after warm-up, saved as a Chrome/Perfetto trace, and its GPU kernels summed by
// name and by kind (matmul, attention, the linear-attention kernels, element-wise/normalisation,
// reductions, copies, optimizer) against the wall time of the traced steps.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace mixbench {

// Kind of a GPU kernel from its name: "matmul", "attention", "linear_attention", "elementwise",
// "reduction", "copy", "optimizer" or "other".
std::string kernel_kind(const std::string& kernel_name);

struct KernelTime {
  std::string name;
  std::string op;  // the LibTorch operator that launched it ("" when unknown)
  int64_t calls = 0;
  double seconds = 0;
};
// The summary of a traced window: kernel time by kind and the top kernels, shares of the wall time;
// "top_ops" sums kernel time by launching operator; busy = Σ kernel time / wall (kernels on one stream do not overlap, so 1 − busy is the idle share).
nlohmann::json summarize_kernels(const std::vector<KernelTime>& kernels, double wall_s, int64_t steps, int top = 25);

class StepTrace {
 public:
  StepTrace();
  ~StepTrace();
  void start(bool cuda);
  // Stops, writes the trace to `path` (Chrome trace JSON; "" = none) and returns summarize_kernels'
  // summary of the GPU kernels (or of the CPU operators when no GPU ran).
  nlohmann::json stop(const std::string& path, double wall_s, int64_t steps);
  bool active() const { return active_; }

 private:
  bool active_ = false, cuda_ = false;
};

}  // namespace mixbench
