// Named scopes that LibTorch's RecordFunction observers see (the profiler; tests/op_count.h counts
// the work a decode step launches with them). Both cost one check when no observer is installed.
//   OpScope       a mixbench op that is one fused kernel launch on a GPU ("mixbench::<op>"); off
//                 the GPU the LibTorch ops standing in for the kernel run inside it.
//   SectionScope  a part of a pass ("embed", "layer3.mixer", "layer3.mlp", "head"), a user scope.
#pragma once
#include <ATen/record_function.h>

#include <string>
#include <string_view>

namespace mixbench {

class OpScope {
 public:
  // `name` must outlive the scope (a literal).
  explicit OpScope(const char* name) : guard_(at::RecordScope::FUNCTION) {
    if (guard_.isActive()) guard_.before(std::string_view(name), c10::ArrayRef<const c10::IValue>{});
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  at::RecordFunction guard_;
};

class SectionScope {
 public:
  explicit SectionScope(std::string name) : name_(std::move(name)), guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before(std::string_view(name_), c10::ArrayRef<const c10::IValue>{});
  }
  SectionScope(const SectionScope&) = delete;
  SectionScope& operator=(const SectionScope&) = delete;

 private:
  std::string name_;  // before guard_: it outlives the record
  at::RecordFunction guard_;
};

}  // namespace mixbench
