#include "tests/op_count.h"

#include <ATen/record_function.h>
#include <fmt/format.h>

#include <memory>
#include <set>
#include <stdexcept>
#include <string_view>

namespace mixbench::testing {
namespace {

// Operators that launch no work of their own: views, metadata, allocation without a fill, and
// the conversions that only call other operators (counted where they do work).
const std::set<std::string_view>& free_ops() {
  static const std::set<std::string_view> s = {
      "aten::view", "aten::view_as", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view",
      "aten::as_strided", "aten::slice", "aten::select", "aten::narrow", "aten::unsqueeze", "aten::squeeze",
      "aten::expand", "aten::expand_as", "aten::t", "aten::transpose", "aten::permute", "aten::detach",
      "aten::alias", "aten::lift_fresh", "aten::empty", "aten::empty_like", "aten::empty_strided",
      "aten::new_empty", "aten::new_empty_strided", "aten::resize_", "aten::size", "aten::sym_size",
      "aten::stride", "aten::sym_stride", "aten::numel", "aten::sym_numel", "aten::dim", "aten::is_contiguous",
      "aten::contiguous", "aten::to", "aten::linear", "aten::matmul", "aten::split", "aten::split_with_sizes",
      "aten::chunk", "aten::unbind", "aten::flatten", "aten::unflatten", "aten::movedim", "aten::resolve_conj",
      "aten::resolve_neg", "aten::result_type", "aten::_has_compatible_shallow_copy_type", "aten::set_",
      "aten::is_same_size", "aten::promote_types", "aten::_nested_tensor_from_mask_left_aligned", "aten::align_to"};
  return s;
}

enum class Kind { Section, Free, Counted, Inside };

struct Ctx final : at::ObserverContext {
  explicit Ctx(Kind k) : kind(k) {}
  Kind kind;
};

struct State {
  OpCount count;
  std::vector<std::string> sections;  // open sections, innermost last
  int64_t inside = 0;                 // open counted operators
};
thread_local State* state = nullptr;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  State* s = state;
  if (!s) return std::make_unique<Ctx>(Kind::Free);
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    s->sections.emplace_back(fn.name());
    return std::make_unique<Ctx>(Kind::Section);
  }
  if (s->inside > 0) {
    ++s->inside;
    return std::make_unique<Ctx>(Kind::Inside);
  }
  const std::string_view name(fn.name());
  if (free_ops().count(name)) return std::make_unique<Ctx>(Kind::Free);
  const std::string sec = s->sections.empty() ? "-" : s->sections.back();
  auto [it, fresh] = s->count.ops.try_emplace(sec);
  if (fresh) s->count.sections.push_back(sec);
  it->second.emplace_back(name);
  ++s->inside;
  return std::make_unique<Ctx>(Kind::Counted);
}

void on_end(const at::RecordFunction&, at::ObserverContext* c) {
  State* s = state;
  if (!s || !c) return;
  switch (static_cast<Ctx*>(c)->kind) {
    case Kind::Section:
      if (!s->sections.empty()) s->sections.pop_back();
      break;
    case Kind::Counted:
    case Kind::Inside:
      --s->inside;
      break;
    case Kind::Free: break;
  }
}

}  // namespace

int64_t OpCount::total() const {
  int64_t n = 0;
  for (const auto& [sec, v] : ops) n += int64_t(v.size());
  return n;
}

int64_t OpCount::in(const std::string& section) const {
  auto it = ops.find(section);
  return it == ops.end() ? 0 : int64_t(it->second.size());
}

int64_t OpCount::layer(int64_t i) const {
  return in(fmt::format("layer{}.mixer", i)) + in(fmt::format("layer{}.mlp", i));
}

std::string OpCount::table() const {
  std::string out;
  for (const auto& sec : sections) {
    std::map<std::string, int> m;
    for (const auto& o : ops.at(sec)) ++m[o];
    std::string list;
    for (const auto& [o, k] : m) list += fmt::format(" {}{}", o, k > 1 ? fmt::format("×{}", k) : "");
    out += fmt::format("  {:<14} {:>3} |{}\n", sec, in(sec), list);
  }
  out += fmt::format("  {:<14} {:>3}\n", "total", total());
  return out;
}

OpCounter::OpCounter() {
  if (state) throw std::logic_error("OpCounter: one counter per thread at a time");
  state = new State();
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                           .needsInputs(false)
                                           .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  active_ = true;
}

OpCount OpCounter::result() {
  if (!active_) throw std::logic_error("OpCounter: result() taken already");
  at::removeCallback(handle_);
  active_ = false;
  OpCount c = std::move(state->count);
  delete state;
  state = nullptr;
  return c;
}

OpCounter::~OpCounter() {
  if (active_) result();
}

}  // namespace mixbench::testing
