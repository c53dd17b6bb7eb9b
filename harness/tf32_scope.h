// TF32 tensor-core matmuls (cuBLAS) for fp32 compute while the scope lives; the process's previous
// setting comes back when it ends, so that a training run or a task suite inside a longer process
// (tests, a sweep) does not change the precision of fp32 matmuls that run after it.
#pragma once
#include <ATen/Context.h>

namespace mixbench {

class Tf32Scope {
 public:
  explicit Tf32Scope(bool on) : prev_(at::globalContext().allowTF32CuBLAS()), set_(on) {
    if (set_) at::globalContext().setAllowTF32CuBLAS(true);
  }
  ~Tf32Scope() {
    if (set_) at::globalContext().setAllowTF32CuBLAS(prev_);
  }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool prev_, set_;
};

}  // namespace mixbench
