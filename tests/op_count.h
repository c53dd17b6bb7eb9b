// Counts the work a piece of code launches, as seen by LibTorch's dispatcher (RecordFunction):
// the proxy of CUDA kernels per decode step that the CPU can measure. An operator call counts
// once, and the calls it makes inside are not counted again (aten::linear → aten::mm is one);
// view and metadata operators (view, reshape, slice, select, transpose, empty, …, and the
// conversions aten::to / contiguous / linear / matmul themselves) count nothing but let their
// inner calls count (a reshape that copies counts its clone). A mixbench op (OpScope,
// harness/op_scope.h, "mixbench::<op>") counts once, as the one fused kernel it is on a GPU:
// the LibTorch ops of its CPU stand-in are not counted. Counts are kept per section
// (SectionScope: "embed", "layer<i>.mixer", "layer<i>.mlp", "head"; "-" outside every section).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mixbench::testing {

struct OpCount {
  std::vector<std::string> sections;                       // in order of first count
  std::map<std::string, std::vector<std::string>> ops;     // section -> counted operator names
  int64_t total() const;
  int64_t in(const std::string& section) const;            // 0 for a section without counts
  // Per layer: "layer<i>.mixer" + "layer<i>.mlp".
  int64_t layer(int64_t i) const;
  // One line per section: its count and its operators with their multiplicities.
  std::string table() const;
};

// Counts on the constructing thread from construction until result() or destruction.
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;
  // Stops counting and returns the counts.
  OpCount result();

 private:
  uint64_t handle_ = 0;
  bool active_ = false;
};

}  // namespace mixbench::testing
