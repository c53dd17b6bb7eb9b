// An ordered name -> tensor map: the inputs, outputs and gradients that flow through the harness.
#pragma once
#include <ATen/core/Tensor.h>
#include <string>
#include <utility>
#include <vector>

namespace mixbench {

class TensorMap {
 public:
  using Entry = std::pair<std::string, at::Tensor>;
  TensorMap() = default;
  TensorMap(std::initializer_list<Entry> init) : entries_(init) {}

  bool has(const std::string& name) const;
  const at::Tensor& at(const std::string& name) const;  // throws InputError when missing
  at::Tensor get_or(const std::string& name, const at::Tensor& fallback) const;
  void set(const std::string& name, at::Tensor t);        // insert or replace, keeps order
  void erase(const std::string& name);
  std::vector<std::string> names() const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace mixbench
