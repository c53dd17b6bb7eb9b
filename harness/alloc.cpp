#include "harness/alloc.h"

#include <ATen/ATen.h>

#include <atomic>

namespace mixbench {

namespace {
std::atomic<bool> g_poison{false};
}

PoisonScope::PoisonScope(bool on) : prev_(g_poison.exchange(on)) {}
PoisonScope::~PoisonScope() { g_poison = prev_; }
bool PoisonScope::active() { return g_poison; }

at::Tensor alloc_output(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  at::Tensor t = at::empty(sizes, opts);
  if (g_poison && at::isFloatingType(t.scalar_type())) t.fill_(std::numeric_limits<double>::quiet_NaN());
  return t;
}

}  // namespace mixbench
