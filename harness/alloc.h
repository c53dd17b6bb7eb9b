// Output and scratch allocation for optimized paths. While poisoning is on (the conformance suite
// turns it on), every buffer handed out is filled with NaN, so an element a kernel forgets to
// write makes the case fail instead of passing on leftover memory.
#pragma once
#include <ATen/core/Tensor.h>

namespace mixbench {

at::Tensor alloc_output(at::IntArrayRef sizes, const at::TensorOptions& opts);

class PoisonScope {
 public:
  explicit PoisonScope(bool on = true);
  ~PoisonScope();
  static bool active();
 private:
  bool prev_;
};

}  // namespace mixbench
