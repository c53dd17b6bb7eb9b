// An independent FLOP count of what LibTorch actually executes on this thread, taken from the
// dispatcher (RecordFunction): matrix products (mm, addmm, bmm, baddbmm, mv, addmv, dot) and triangular
// solves by their shapes, and scaled-dot-product attention by its visible (query, key) pairs — 2·(Dk + Dv) FLOPs
// per pair, from is_causal or the mask actually passed. Nested calls inside an attention call are
// not counted twice. Used to audit the accountants.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace mixbench {

class FlopCounter {
 public:
  FlopCounter();   // starts counting on this thread
  ~FlopCounter();  // stops
  double total() const;
  const std::map<std::string, double>& by_op() const;
  struct State;

 private:
  std::shared_ptr<State> state_;
  uint64_t handle_ = 0;
};

}  // namespace mixbench
