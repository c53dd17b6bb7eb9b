#include "harness/registry.h"
#include "harness/method_selection.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "harness/errors.h"
#include "harness/nvtx.h"

#if defined(MIXBENCH_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace mixbench {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Reference: return "reference";
    case Backend::CPU: return "cpu";
    case Backend::CUDA: return "cuda";
  }
  return "?";
}

int64_t cache_pos(const TensorMap& cache) { return cache.has("pos") ? cache.at("pos").item<int64_t>() : 0; }

void set_cache_pos(TensorMap& cache, int64_t pos) { cache.set("pos", at::scalar_tensor(pos, at::TensorOptions().dtype(at::kLong))); }

// Entries named "w.<...>" are not state: a layer's weights rearranged once at prefill for its
// decode step (e.g. concatenated projections), which a static cache keeps beside its buffers.
int64_t cache_bytes(const TensorMap& cache) {
  int64_t n = 0;
  for (const auto& [name, t] : cache)
    if (name != "pos" && name != "pos_dev" && name != "capacity" && name.rfind("w.", 0) != 0 && t.defined())
      n += int64_t(t.numel()) * int64_t(t.element_size());
  return n;
}

bool cache_is_static(const TensorMap& cache) { return cache.has("pos_dev") && cache.has("capacity"); }

int64_t cache_capacity(const TensorMap& cache) { return cache.has("capacity") ? cache.at("capacity").item<int64_t>() : 0; }

const at::Tensor& cache_pos_dev(const TensorMap& cache) { return cache.at("pos_dev"); }

void reset_cache(TensorMap& cache) {
  if (cache_is_static(cache)) return;  // its buffers stay where a captured graph reads them; prefill overwrites them
  cache = TensorMap();
}

at::Tensor static_input_projection(const TensorMap& in, const TensorMap& cache) {
  const at::Tensor& x = in.at("x");
  const int64_t B = x.size(0);
  if (in.has(kStaticInputProj)) return in.at(kStaticInputProj).view({B, -1});
  return at::linear(x.view({B, x.size(2)}), cache.at(kStaticInput));
}

void cache_store(TensorMap& cache, const std::string& name, const at::Tensor& t) {
  if (cache_is_static(cache) && cache.has(name)) {
    const at::Tensor& buf = cache.at(name);
    if (buf.sizes() != t.sizes())
      throw std::logic_error(fmt::format("static cache '{}': shape {} cannot take {}", name, c10::str(buf.sizes()), c10::str(t.sizes())));
    buf.copy_(t);
    return;
  }
  cache.set(name, t.contiguous());
}

ParamCount& ParamCount::operator+=(const ParamCount& o) {
  wte += o.wte;
  value_embeds += o.value_embeds;
  lm_head += o.lm_head;
  transformer_matrices += o.transformer_matrices;
  scalars += o.scalars;
  matmul += o.matmul;
  return *this;
}

// ------------------------------------------------------------------ TensorMap
bool TensorMap::has(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.first == name) return true;
  return false;
}
const at::Tensor& TensorMap::at(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.first == name) return e.second;
  throw InputError(fmt::format("missing tensor '{}'", name));
}
at::Tensor TensorMap::get_or(const std::string& name, const at::Tensor& fallback) const {
  for (const auto& e : entries_)
    if (e.first == name) return e.second;
  return fallback;
}
void TensorMap::set(const std::string& name, at::Tensor t) {
  for (auto& e : entries_)
    if (e.first == name) {
      e.second = std::move(t);
      return;
    }
  entries_.emplace_back(name, std::move(t));
}
void TensorMap::erase(const std::string& name) {
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return e.first == name; }),
                 entries_.end());
}
std::vector<std::string> TensorMap::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.first);
  return out;
}

// ------------------------------------------------------------------ Registry
Registry& Registry::get() {
  static Registry r;
  return r;
}

bool Registry::add(OpSpec spec) {
  if (ops_.count(spec.name)) throw std::logic_error("op registered twice: " + spec.name);
  if (!spec.reference || !spec.cpu || !spec.make_inputs || !spec.cases)
    throw std::logic_error("op " + spec.name + " lacks reference, cpu path, inputs or cases");
  std::string name = spec.name;
  ops_.emplace(name, std::move(spec));
  return true;
}

bool Registry::add(MethodSpec spec) {
  if (methods_.count(spec.name)) throw std::logic_error("method registered twice: " + spec.name);
  if (completed_) throw std::logic_error("method " + spec.name + " registered after the first lookup");
  if (!spec.reference || !spec.forward || !spec.params || !spec.make_inputs || !spec.cases || !spec.account)
    throw std::logic_error("method " + spec.name + " lacks a required part");
  if (bool(spec.prefill) != bool(spec.decode))
    throw std::logic_error("method " + spec.name + " registers only one of prefill/decode");
  std::string name = spec.name;
  methods_.emplace(name, std::move(spec));
  return true;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& name, const std::vector<std::string>& known) {
  auto near = closest_names(name, known);
  if (near.empty()) return "";
  std::string s;
  for (const auto& n : near) s += (s.empty() ? "" : ", ") + n;
  return fmt::format(" (did you mean: {}?)", s);
}
}  // namespace

namespace {
std::vector<UnlistedMethod>& unlisted_store() {
  static std::vector<UnlistedMethod> v;
  return v;
}
}  // namespace

bool add_unlisted_method(UnlistedMethod m) {
  auto& v = unlisted_store();
  auto at = std::find_if(v.begin(), v.end(), [&](const UnlistedMethod& u) { return u.name >= m.name; });
  if (at != v.end() && at->name == m.name) throw std::logic_error("unlisted method noted twice: " + m.name);
  v.insert(at, std::move(m));
  return true;
}

const std::vector<UnlistedMethod>& unlisted_methods() { return unlisted_store(); }

std::vector<std::string> closest_names(const std::string& name, const std::vector<std::string>& known,
                                       size_t max_results) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& k : known) {
    size_t d = edit_distance(name, k);
    if (k.find(name) != std::string::npos || name.find(k) != std::string::npos) d = std::min<size_t>(d, 1);
    if (d <= std::max<size_t>(2, name.size() / 2)) scored.emplace_back(d, k);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < max_results; ++i) out.push_back(scored[i].second);
  return out;
}

const OpSpec& Registry::op(const std::string& name) const {
  auto it = ops_.find(name);
  if (it == ops_.end()) {
    std::vector<std::string> known;
    for (const auto& [k, v] : ops_) known.push_back(k);
    throw UsageError(fmt::format("unknown op '{}'{}", name, suggestion(name, known)));
  }
  return it->second;
}

void Registry::complete_methods() const {
  if (completed_) return;
  completed_ = true;  // before the hooks: they look their components up
  for (auto& [k, v] : methods_)
    if (v.complete) {
      auto hook = std::move(v.complete);
      v.complete = nullptr;
      hook(v);
    }
}

const MethodSpec& Registry::method(const std::string& name) const {
  complete_methods();
  auto it = methods_.find(name);
  if (it == methods_.end()) {
    std::vector<std::string> known;
    for (const auto& [k, v] : methods_) known.push_back(k);
    throw UsageError(fmt::format("unknown method '{}'{}", name, suggestion(name, known)));
  }
  return it->second;
}

std::vector<const OpSpec*> Registry::ops() const {
  std::vector<const OpSpec*> out;
  for (const auto& [k, v] : ops_) out.push_back(&v);
  return out;
}
std::vector<const MethodSpec*> Registry::methods() const {
  complete_methods();
  std::vector<const MethodSpec*> out;
  for (const auto& [k, v] : methods_) out.push_back(&v);
  return out;
}

// ------------------------------------------------------------------ method context, op calls
namespace {
thread_local std::string g_current_method = "op";
thread_local bool g_nvtx_recording = false;
thread_local std::vector<std::string> g_nvtx_names;
thread_local std::vector<std::string> g_nvtx_stack;  // open ranges of this thread (kept while recording)
thread_local std::vector<std::vector<std::string>> g_nvtx_stacks;
}  // namespace

namespace {
thread_local std::vector<std::string> g_kernel_notes;
}
void note_kernel(const std::string& name) {
  if (std::find(g_kernel_notes.begin(), g_kernel_notes.end(), name) == g_kernel_notes.end())
    g_kernel_notes.push_back(name);
}
std::string take_kernel_notes() {
  std::string s;
  for (const auto& n : g_kernel_notes) s += (s.empty() ? "" : ",") + n;
  g_kernel_notes.clear();
  return s;
}

ScopedMethod::ScopedMethod(const std::string& name) : prev_(g_current_method) { g_current_method = name; }
ScopedMethod::~ScopedMethod() { g_current_method = prev_; }
const std::string& ScopedMethod::current() { return g_current_method; }

namespace {
thread_local int64_t g_call_op_count = 0;
std::map<std::string, MethodSelection>& method_selections() {
  static std::map<std::string, MethodSelection> m;
  return m;
}
}  // namespace
int64_t call_op_count() { return g_call_op_count; }
void register_method_selection(const std::string& method, MethodSelection s) { method_selections()[method] = std::move(s); }
const MethodSelection* method_selection(const std::string& method) {
  auto it = method_selections().find(method);
  return it == method_selections().end() ? nullptr : &it->second;
}

TensorMap call_op(const std::string& op, Backend backend, const TensorMap& inputs, const Config& params) {
  ++g_call_op_count;
  const OpSpec& spec = Registry::get().op(op);
  NvtxRange range(nvtx_name({ScopedMethod::current(), op, "forward"}));
  switch (backend) {
    case Backend::Reference: return spec.reference(inputs, params);
    case Backend::CPU: return spec.cpu(inputs, params);
    case Backend::CUDA:
      if (!spec.cuda) throw UsageError(fmt::format("op '{}' has no CUDA path", op));
      return spec.cuda(inputs, params);
  }
  throw std::logic_error("bad backend");
}

// ------------------------------------------------------------------ NVTX
std::string nvtx_name(std::initializer_list<std::string> parts) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += '.';
    for (char c : p) out += (c == '/' || c == '.' || c == '@' || c == '[' || c == ']' || c == '*' || c == ',' || std::isspace((unsigned char)c)) ? '_' : c;
  }
  return out;
}

#if defined(MIXBENCH_NVTX)
static nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t d = nvtxDomainCreateA("mixbench");
  return d;
}
#endif

NvtxRange::NvtxRange(const std::string& name) {
  if (g_nvtx_recording) {
    g_nvtx_names.push_back(name);
    g_nvtx_stack.push_back(name);
    g_nvtx_stacks.push_back(g_nvtx_stack);
    recorded_ = true;
  }
#if defined(MIXBENCH_NVTX)
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name.c_str();
  nvtxDomainRangePushEx(nvtx_domain(), &a);
#endif
}
NvtxRange::~NvtxRange() {
  if (recorded_ && !g_nvtx_stack.empty()) g_nvtx_stack.pop_back();
#if defined(MIXBENCH_NVTX)
  nvtxDomainRangePop(nvtx_domain());
#endif
}
void NvtxRange::start_recording() {
  g_nvtx_recording = true;
  g_nvtx_names.clear();
  g_nvtx_stack.clear();
  g_nvtx_stacks.clear();
}
std::vector<std::string> NvtxRange::stop_recording() {
  g_nvtx_recording = false;
  return std::move(g_nvtx_names);
}
std::vector<std::vector<std::string>> NvtxRange::recorded_stacks() { return g_nvtx_stacks; }

}  // namespace mixbench
