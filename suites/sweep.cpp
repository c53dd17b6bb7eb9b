#include "suites/sweep.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <set>
#include <sstream>

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

#include "harness/args.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/nvtx.h"

namespace mixbench {

namespace {
using Json = nlohmann::json;

// ------------------------------------------------------------------ parsing helpers
int64_t parse_count(const std::string& text, const char* what) {
  std::string s = text;
  int64_t mult = 1;
  if (!s.empty()) {
    const char c = char(std::tolower(static_cast<unsigned char>(s.back())));
    if (c == 'k') mult = 1024;
    else if (c == 'm') mult = 1024 * 1024;
    else if (c == 'g') mult = int64_t(1024) * 1024 * 1024;
    if (mult != 1) s.pop_back();
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError(fmt::format("bad {} '{}' (use a positive integer, optionally with k, m or g)", what, text));
  int64_t v = 0;
  try {
    v = std::stoll(s);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("bad {} '{}'", what, text));
  }
  if (v <= 0) throw UsageError(fmt::format("{} must be positive, got '{}'", what, text));
  return v * mult;
}

std::vector<int64_t> parse_int_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  for (const auto& item : split(text, ',')) out.push_back(parse_count(item, what));
  if (out.empty()) throw UsageError(fmt::format("empty {} list", what));
  return out;
}

// ------------------------------------------------------------------ statistics
double quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return NAN;
  const double pos = p * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

Json timing_json(std::vector<double> s, int warmup) {
  Json samples = s;
  std::sort(s.begin(), s.end());
  return {{"reps", int64_t(s.size())},
          {"warmup", warmup},
          {"median_s", quantile(s, 0.5)},
          {"min_s", s.front()},
          {"max_s", s.back()},
          {"iqr_s", quantile(s, 0.75) - quantile(s, 0.25)},
          {"samples_s", samples}};
}

// ------------------------------------------------------------------ memory probes
int64_t proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) {
      std::istringstream ss(line.substr(k.size()));
      int64_t v = -1;
      ss >> v;
      return v;
    }
  return -1;
}

// Linux >= 4.0: writing "5" to clear_refs resets VmHWM to the current RSS.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f);
}

bool is_oom_message(const std::string& m) {
  return m.find("out of memory") != std::string::npos || m.find("not enough memory") != std::string::npos ||
         m.find("can't allocate memory") != std::string::npos;
}

// ------------------------------------------------------------------ a sweep point
// What the sweep needs from a unit at one (B, T): the accountant's numbers (before anything is
// allocated, so that --memory-limit can refuse the point) and a step to time.
struct Prediction {
  double fwd_flops_per_token = NAN;  // accountant; NaN where the unit has none (ops)
  double bytes = NAN;                // predicted memory of the point
  std::string bytes_formula;
  Json shape;
  Json config;
  Json extra_accountant = Json::object();  // mode-specific accountant numbers (decode: FLOPs, cache bytes)
};

struct Point {
  std::function<void(const std::string& nvtx_prefix)> step;  // one repetition
  std::function<Json()> measured;                             // optional: measurements after timing
};

// A unit of the sweep: one method at model or layer level, or one op.
struct Unit {
  std::string method;  // method name (op level: the first selected method that calls the op)
  std::string op;      // op name at op level, else empty
  std::function<Prediction(int64_t B, int64_t T)> predict;
  std::function<void(int64_t T)> setup;                  // builds parameters once; may throw OOM
  std::function<Point(int64_t B, int64_t T)> prepare;  // allocates inputs; may throw OOM
  std::function<void()> release;                         // drop gradients etc. after an OOM
};

at::Device device_of(const std::string& d) { return d == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU); }

bool floating(const at::Tensor& t) { return at::isFloatingType(t.scalar_type()); }

void sgd_update(TensorMap& params, double lr) {
  c10::NoGradGuard ng;
  for (auto& [n, p] : params) {
    if (!p.requires_grad()) continue;
    if (p.grad().defined()) p.sub_(p.grad(), lr);
    p.mutable_grad().reset();
  }
}

void drop_grads(TensorMap& params) {
  for (auto& [n, p] : params)
    if (p.defined() && p.grad().defined()) p.mutable_grad().reset();
}

Config method_config(const MethodSpec& m, const SweepOptions& opt, int64_t T) {
  Config c = m.config.parse(opt.config);
  c = c.with("seq_len", T);
  m.config.validate(c);
  return c;
}

// Model level: the nanochat backbone with the method in every layer.
Unit model_unit(const MethodSpec& method, const SweepOptions& opt) {
  struct State {
    std::optional<Model> model;
  };
  auto st = std::make_shared<State>();
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const int64_t eb = int64_t(c10::elementSize(dt));
  const bool train = opt.mode == "train";
  Unit u;
  u.method = method.name;
  u.predict = [&method, opt, eb, train](int64_t B, int64_t T) {
    Config cfg = method_config(method, opt, T);
    CostQuery q;
    q.T = T;
    q.context = T;
    q.dtype_bytes = eb;
    ModelCost mc = account_model(method, cfg, q);
    ModelDims d = model_dims(cfg);
    const double BT = double(B * T);
    const double pbytes = double(mc.params.total()) * double(eb);
    Prediction p;
    p.fwd_flops_per_token = mc.fwd_flops;
    if (train) {
      p.bytes = 2.0 * pbytes + mc.act_bytes * BT;
      p.bytes_formula = "2·params·elem (weights + grads) + activation_bytes/token·B·T";
    } else {
      // prefill computes the logits of the last position only (model_prefill)
      p.fwd_flops_per_token = mc.fwd_flops - 2.0 * double(mc.params.lm_head) * double(T - 1) / double(T);
      p.bytes = pbytes + mc.cache_bytes_per_token * BT + mc.state_bytes * double(B) + 4.0 * double(d.vocab) * double(B);
      p.bytes_formula = "params·elem + kv_cache_bytes/token·B·T + state_bytes·B + fp32 last-position logits 4·vocab·B";
    }
    p.shape = {{"B", B}, {"T", T}, {"n_layer", d.n_layer}, {"d_model", d.d_model}, {"n_head", d.n_head},
               {"head_dim", d.head_dim}, {"vocab", d.vocab}};
    p.config = cfg.to_json();
    return p;
  };
  u.setup = [&method, opt, st, dt](int64_t T) {
    if (st->model) return;
    Config cfg = method_config(method, opt, T);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    Model m = build_model(method, cfg, gen, at::TensorOptions().dtype(at::kFloat));
    TensorMap moved;
    for (const auto& [n, p] : m.params) moved.set(n, p.to(device_of(opt.device), dt).detach());
    m.params = std::move(moved);
    st->model = std::move(m);
  };
  u.prepare = [&method, opt, st, train](int64_t B, int64_t T) {
    Config cfg = method_config(method, opt, T);
    const at::Device dev = device_of(opt.device);
    const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
    Model& m = *st->model;
    m.cfg = cfg;  // parameters do not depend on seq_len; windows may
    for (auto& [n, p] : m.params) p.requires_grad_(train);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    at::Tensor idx = at::randint(m.dims.vocab, {B, T}, gen, lopts).to(dev);
    at::Tensor tgt = train ? at::randint(m.dims.vocab, {B, T}, gen, lopts).to(dev) : at::Tensor();
    Point pt;
    const double lr = opt.sgd_lr;
    pt.step = [st, idx, tgt, train, backend, lr](const std::string& nv) {
      Model& m = *st->model;
      if (!train) {
        c10::NoGradGuard ng;
        NvtxRange r(nv + "/forward");
        model_prefill(m, idx, backend);
        return;
      }
      at::Tensor loss;
      {
        NvtxRange r(nv + "/forward");
        loss = model_loss(m, idx, tgt, backend);
      }
      {
        NvtxRange r(nv + "/backward");
        loss.backward();
      }
      NvtxRange r(nv + "/update");
      sgd_update(m.params, lr);
    };
    return pt;
  };
  u.release = [st] {
    if (st->model) drop_grads(st->model->params);
  };
  return u;
}

// Decode at model level: per point (B, c) the model prefills c tokens into its caches (untimed),
// then each repetition is one decode step of B tokens (the context grows by one per step).
Unit decode_unit(const MethodSpec& method, const SweepOptions& opt) {
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const int64_t eb = int64_t(c10::elementSize(dt));
  struct State {
    std::optional<Model> model;
  };
  auto cs = std::make_shared<State>();
  Unit u;
  u.method = method.name;
  u.predict = [&method, opt, eb](int64_t B, int64_t c) {
    Config cfg = method_config(method, opt, c);
    CostQuery q;
    q.T = c;
    q.context = c;
    q.dtype_bytes = eb;
    ModelCost mc = account_model(method, cfg, q);
    ModelDims d = model_dims(cfg);
    const double pbytes = double(mc.params.total()) * double(eb);
    const double cache = (mc.cache_bytes_per_token * double(c) + mc.state_bytes) * double(B);
    Prediction p;
    p.fwd_flops_per_token = mc.decode_flops;
    p.bytes = pbytes + cache + 4.0 * double(d.vocab) * double(B);
    p.bytes_formula = "params·elem + (kv_cache_bytes/token·c + state_bytes)·B + fp32 logits 4·vocab·B";
    p.extra_accountant = {{"context", c},
                          {"decode_flops_per_token", mc.decode_flops},
                          {"cache_bytes", cache},
                          {"cache_bytes_formula", "(kv_cache_bytes/token·c + state_bytes)·B"},
                          {"kv_cache_bytes_per_token", mc.cache_bytes_per_token},
                          {"state_bytes", mc.state_bytes}};
    p.shape = {{"B", B}, {"T", c}, {"context", c}, {"n_layer", d.n_layer}, {"d_model", d.d_model},
               {"n_head", d.n_head}, {"head_dim", d.head_dim}, {"vocab", d.vocab}};
    p.config = cfg.to_json();
    return p;
  };
  u.setup = [&method, opt, cs, dt](int64_t c) {
    if (cs->model) return;
    Config cfg = method_config(method, opt, c);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    Model m = build_model(method, cfg, gen, at::TensorOptions().dtype(at::kFloat));
    TensorMap moved;
    for (const auto& [n, p] : m.params) moved.set(n, p.to(device_of(opt.device), dt).detach());
    m.params = std::move(moved);
    cs->model = std::move(m);
  };
  u.prepare = [&method, opt, cs](int64_t B, int64_t c) {
    c10::NoGradGuard ng;
    const at::Device dev = device_of(opt.device);
    const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
    Model& m = *cs->model;
    m.cfg = method_config(method, opt, c);  // windows follow seq_len = c
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    at::Tensor idx = at::randint(m.dims.vocab, {B, c}, gen, lopts).to(dev);
    auto cache = std::make_shared<ModelCache>();
    at::Tensor logits = model_prefill(m, idx, backend, cache.get());
    const int64_t after_prefill = cache->bytes();
    auto next = std::make_shared<at::Tensor>(logits.argmax(-1));  // greedy: [B,1]
    Point pt;
    pt.step = [cs, cache, next, backend](const std::string& nv) {
      c10::NoGradGuard ng;
      NvtxRange r(nv + "/decode");
      *next = model_decode_step(*cs->model, *next, *cache, backend).argmax(-1);
    };
    pt.measured = [cache, after_prefill, c]() -> Json {
      return {{"bytes_after_prefill", after_prefill}, {"context_after_prefill", c},
              {"bytes_at_end", cache->bytes()}, {"context_at_end", cache->pos}};
    };
    return pt;
  };
  u.release = [cs] { cs->model.reset(); };
  return u;
}

// Layer level: layer 0 of the method's model, on its own (no backbone).
Unit layer_unit(const MethodSpec& method, const SweepOptions& opt) {
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const int64_t eb = int64_t(c10::elementSize(dt));
  const bool train = opt.mode == "train";
  const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
  struct State {
    TensorMap params;
  };
  auto st = std::make_shared<State>();
  Unit u;
  u.method = method.name;
  u.predict = [&method, opt, eb, train](int64_t B, int64_t T) {
    Config cfg = method_config(method, opt, T);
    ModelDims d = model_dims(cfg);
    LayerCtx ctx{0, d.n_layer};
    CostQuery q;
    q.T = T;
    q.context = T;
    q.dtype_bytes = eb;
    LayerCost lc = method.account(cfg, ctx, q);
    const double BT = double(B * T);
    const double pbytes = double(lc.params.total()) * double(eb);
    const double io = 2.0 * double(d.d_model) * double(eb) * BT;  // x and y
    Prediction p;
    p.fwd_flops_per_token = lc.fwd_flops;
    if (train) {
      p.bytes = 2.0 * pbytes + 2.0 * io + lc.act_bytes * BT;
      p.bytes_formula = "2·layer params·elem + 2·(x, y)·elem·B·T + layer activation_bytes/token·B·T";
    } else {
      p.bytes = pbytes + io + lc.cache_bytes_per_token * BT + lc.state_bytes * double(B);
      p.bytes_formula = "layer params·elem + (x, y)·elem·B·T + kv_cache_bytes/token·B·T + state_bytes·B";
    }
    p.shape = {{"B", B}, {"T", T}, {"layer", 0}, {"n_layer", d.n_layer}, {"d_model", d.d_model},
               {"n_head", d.n_head}, {"head_dim", d.head_dim}};
    p.config = cfg.to_json();
    return p;
  };
  u.setup = [&method, opt, st, dt](int64_t T) {
    if (st->params.size() != 0) return;
    Config cfg = method_config(method, opt, T);
    LayerCtx ctx{0, model_dims(cfg).n_layer};
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    for (const auto& def : method.params(cfg, ctx))
      st->params.set(def.name,
                     random_param(def, gen, at::TensorOptions().dtype(at::kDouble)).to(device_of(opt.device), dt).detach());
  };
  u.prepare = [&method, opt, st, dt, train, backend](int64_t B, int64_t T) {
    Config cfg = method_config(method, opt, T);
    ModelDims d = model_dims(cfg);
    LayerCtx ctx{0, d.n_layer};
    const at::Device dev = device_of(opt.device);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
    for (auto& [n, p] : st->params) p.requires_grad_(train);
    TensorMap inputs;
    for (const auto& [n, t] : method.make_inputs(cfg, ctx, B, T, gen))
      inputs.set(n, floating(t) ? t.to(dt).to(dev) : t.to(dev));
    at::Tensor dy;
    if (train) {
      inputs.at("x").requires_grad_(true);
      dy = at::randn({B, T, d.d_model}, gen, at::TensorOptions().dtype(at::kDouble)).to(dt).to(dev);
    }
    Point pt;
    const double lr = opt.sgd_lr;
    pt.step = [&method, st, inputs, dy, cfg, ctx, train, backend, lr](const std::string& nv) {
      TensorMap in = inputs;
      for (const auto& [n, p] : st->params) in.set(n, p);
      if (!train) {
        c10::NoGradGuard ng;
        NvtxRange r(nv + "/forward");
        method.forward(in, cfg, ctx, backend);
        return;
      }
      at::Tensor loss;
      {
        NvtxRange r(nv + "/forward");
        loss = (method.forward(in, cfg, ctx, backend).at("y") * dy).sum();
      }
      {
        NvtxRange r(nv + "/backward");
        loss.backward();
      }
      NvtxRange r(nv + "/update");
      sgd_update(st->params, lr);
      inputs.at("x").mutable_grad().reset();
    };
    return pt;
  };
  u.release = [st] { drop_grads(st->params); };
  return u;
}

// Op level: the op on its own with its default parameters (and any --config keys it declares).
Unit op_unit(const std::string& method_name, const OpSpec& op, const SweepOptions& opt) {
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const int64_t eb = int64_t(c10::elementSize(dt));
  const bool train = opt.mode == "train";
  const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
  std::string overrides;
  for (const auto& kv : split(opt.config, ','))
    if (op.params.find(kv.substr(0, kv.find('='))))
      overrides += (overrides.empty() ? "" : ",") + kv;
  const Config cfg = op.params.parse(overrides);
  Unit u;
  u.method = method_name;
  u.op = op.name;
  // The op declares no accountant: FLOPs are not predicted; memory is its inputs (×2 with grads).
  u.predict = [&op, cfg, opt, eb, train](int64_t B, int64_t T) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    double in_elems = 0;
    Json shapes = Json::object();
    for (const auto& [n, t] : op.make_inputs(cfg, B, T, gen)) {
      in_elems += double(t.numel());
      shapes[n] = t.sizes().vec();
    }
    Prediction p;
    p.bytes = in_elems * double(eb) * (train ? 2.0 : 1.0);
    p.bytes_formula = train ? "2·inputs·elem (inputs + their grads; outputs not predicted)"
                            : "inputs·elem (outputs not predicted)";
    p.shape = {{"B", B}, {"T", T}, {"inputs", shapes}};
    p.config = cfg.to_json();
    return p;
  };
  u.prepare = [&op, cfg, opt, dt, train, backend, method_name](int64_t B, int64_t T) {
    const at::Device dev = device_of(opt.device);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    std::set<std::string> nondiff;
    for (const auto& d : op.inputs)
      if (!d.differentiable) nondiff.insert(d.name);
    TensorMap inputs;
    for (const auto& [n, t] : op.make_inputs(cfg, B, T, gen)) {
      at::Tensor x = floating(t) ? t.to(dt).to(dev) : t.to(dev);
      if (train && floating(x) && !nondiff.count(n)) x.requires_grad_(true);
      inputs.set(n, x);
    }
    Point pt;
    pt.step = [&op, inputs, cfg, train, backend, method_name](const std::string& nv) {
      ScopedMethod sm(method_name);
      if (!train) {
        c10::NoGradGuard ng;
        NvtxRange r(nv + "/forward");
        call_op(op.name, backend, inputs, cfg);
        return;
      }
      at::Tensor loss;
      {
        NvtxRange r(nv + "/forward");
        for (const auto& [n, o] : call_op(op.name, backend, inputs, cfg))
          if (floating(o) && o.requires_grad()) loss = loss.defined() ? loss + o.sum() : o.sum();
      }
      if (loss.defined()) {
        NvtxRange r(nv + "/backward");
        loss.backward();
      }
      for (const auto& [n, t] : inputs)
        if (t.grad().defined()) const_cast<at::Tensor&>(t).mutable_grad().reset();
    };
    return pt;
  };
  u.setup = [](int64_t) {};
  u.release = [] {};
  return u;
}

bool method_has_cuda(const MethodSpec& m) {
  bool ok = m.has_cuda;
  for (const auto& o : m.ops) ok = ok && Registry::get().has_op(o) && bool(Registry::get().op(o).cuda);
  return ok;
}

void sync_device(const std::string& device) {
#if defined(MIXBENCH_WITH_CUDA)
  if (device == "cuda") cudaDeviceSynchronize();
#endif
}

void free_device_cache(const std::string& device) {
#if defined(MIXBENCH_WITH_CUDA)
  if (device == "cuda") {
    cudaDeviceSynchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#endif
}

// Times `reps` repetitions after `warmup`; CUDA events on the GPU, steady_clock on the CPU.
std::vector<double> time_reps(const Point& pt, const SweepOptions& opt, const std::string& nv) {
  {
    NvtxRange r(nv + "/warmup");
    for (int i = 0; i < opt.warmup; ++i) pt.step(nv);
    sync_device(opt.device);
  }
  std::vector<double> s;
  NvtxRange r(nv + "/timed");
  for (int i = 0; i < opt.reps; ++i) {
#if defined(MIXBENCH_WITH_CUDA)
    if (opt.device == "cuda") {
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
      cudaEventRecord(a, stream);
      pt.step(nv);
      cudaEventRecord(b, stream);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
      s.push_back(double(ms) * 1e-3);
      continue;
    }
#endif
    auto t0 = std::chrono::steady_clock::now();
    pt.step(nv);
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return s;
}

struct MemProbe {
  std::string device;
  int64_t base = 0;
  bool reset = false;
  void start() {
#if defined(MIXBENCH_WITH_CUDA)
    if (device == "cuda") {
      cudaDeviceSynchronize();
      int dev = 0;
      cudaGetDevice(&dev);
      c10::cuda::CUDACachingAllocator::resetPeakStats(c10::DeviceIndex(dev));
      auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(dev));
      base = st.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].current;
      reset = true;
      return;
    }
#endif
    base = proc_status_kb("VmRSS") * 1024;
    reset = reset_peak_rss();
  }
  Json finish() {
#if defined(MIXBENCH_WITH_CUDA)
    if (device == "cuda") {
      cudaDeviceSynchronize();
      int dev = 0;
      cudaGetDevice(&dev);
      auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(dev));
      const int64_t peak = st.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].peak;
      return {{"source", "cuda_allocator"}, {"peak_bytes", peak}, {"delta_bytes", std::max<int64_t>(0, peak - base)},
              {"peak_reset", true}};
    }
#endif
    const int64_t hwm = proc_status_kb("VmHWM") * 1024;
    const int64_t rss = proc_status_kb("VmRSS") * 1024;
    // Without a reset VmHWM is the process-lifetime peak; the RSS delta is then the honest number.
    const int64_t delta = reset ? hwm - base : rss - base;
    return {{"source", "vmhwm"}, {"peak_bytes", std::max<int64_t>(0, hwm)}, {"delta_bytes", std::max<int64_t>(0, delta)},
            {"peak_reset", reset}};
  }
};

std::string fmt_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.0f} KiB", b / 1024.0);
}

}  // namespace

// ------------------------------------------------------------------ options
std::vector<int64_t> parse_lengths(const std::string& text) {
  if (auto colon = text.find(':'); colon != std::string::npos) {
    const int64_t a = parse_count(text.substr(0, colon), "length");
    const int64_t b = parse_count(text.substr(colon + 1), "length");
    if (b < a) throw UsageError(fmt::format("length range '{}' ends below its start", text));
    std::vector<int64_t> out;
    for (int64_t t = a; t <= b; t *= 2) out.push_back(t);
    return out;
  }
  std::vector<int64_t> out = parse_int_list(text, "length");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double parse_bytes(const std::string& text) { return double(parse_count(text, "byte count")); }

SweepOptions sweep_preset(const std::string& name) {
  SweepOptions o;
  o.preset = name;
  if (name == "cpu-tiny") {
    o.level = "model";
    o.config = "n_layer=2,d_model=128,head_dim=32,vocab=256";
    o.lengths = parse_lengths("128:2048");
    o.batches = {1, 2};
    o.device = "cpu";
    o.dtype = "fp32";
    o.reps = 3;
    o.warmup = 1;
  } else if (name == "gpu-d12") {
    o.level = "model";
    o.config = "n_layer=12";
    o.lengths = parse_lengths("1k:128k");
    o.batches = {1, 2, 4, 8};
    o.device = "cuda";
    o.dtype = "bf16";
    o.reps = 10;
    o.warmup = 3;
  } else {
    auto near = closest_names(name, {"cpu-tiny", "gpu-d12"});
    throw UsageError(fmt::format("unknown preset '{}'{}", name, near.empty() ? "" : " (did you mean " + near[0] + "?)"));
  }
  return o;
}

SweepOptions sweep_options_from_args(const Args& a) {
  SweepOptions o = sweep_preset(a.get_or("preset", "cpu-tiny"));
  auto mode = a.get("mode");
  if (!mode) throw UsageError("sweep needs --mode prefill|decode|train");
  if (*mode != "prefill" && *mode != "decode" && *mode != "train")
    throw UsageError(fmt::format("unknown mode '{}' (use prefill, decode or train)", *mode));
  o.mode = *mode;
  o.level = a.get_or("level", o.level);
  if (o.level != "op" && o.level != "layer" && o.level != "model")
    throw UsageError(fmt::format("unknown level '{}' (use op, layer or model)", o.level));
  if (o.mode == "decode" && o.level != "model")
    throw UsageError(fmt::format("--mode decode runs at model level (the backbone drives the caches), not --level {}", o.level));
  if (auto b = a.get("batch")) o.batches = parse_int_list(*b, "batch size");
  if (auto l = a.get("lengths")) o.lengths = parse_lengths(*l);
  o.device = a.get_or("device", o.device);
  if (o.device != "cpu" && o.device != "cuda") throw UsageError(fmt::format("unknown device '{}' (use cpu or cuda)", o.device));
  o.dtype = a.get_or("dtype", o.dtype);
  parse_dtype(o.dtype);
  if (auto c = a.get("config")) o.config += (o.config.empty() ? "" : ",") + *c;
  o.reps = int(a.get_int("reps", o.reps));
  o.warmup = int(a.get_int("warmup", o.warmup));
  if (o.reps < 1 || o.warmup < 0) throw UsageError("--reps must be >= 1 and --warmup >= 0");
  if (auto m = a.get("memory-limit")) o.memory_limit = parse_bytes(*m);
  o.seed = uint64_t(a.get_int("seed", 0));
  Registry& reg = Registry::get();
  auto methods = a.list("methods");
  if (methods.empty() || (methods.size() == 1 && methods[0] == "all")) {
    methods.clear();
    for (auto* m : reg.methods()) methods.push_back(m->name);
  }
  for (const auto& m : methods) reg.method(m);  // unknown names fail before any work
  o.methods = methods;
  if (o.level == "op") {
    // Op units take the keys their op declares; each key must mean something to a selected method or op.
    for (const auto& kv : split(o.config, ',')) {
      const std::string key = kv.substr(0, kv.find('='));
      bool known = false;
      for (const auto& m : methods) {
        const MethodSpec& ms = reg.method(m);
        known = known || ms.config.find(key) != nullptr;
        for (const auto& op : ms.ops) known = known || (reg.has_op(op) && reg.op(op).params.find(key) != nullptr);
      }
      if (!known) throw UsageError(fmt::format("unknown config field '{}' for the selected methods and their ops", key));
    }
  } else {
    // Every method's config must accept the overrides before anything runs.
    for (const auto& m : methods) method_config(reg.method(m), o, o.lengths.front());
  }
  if (o.device == "cuda" && !at::hasCUDA()) throw UsageError("--device cuda but no CUDA device is available");
  return o;
}

Json sweep_config_json(const SweepOptions& o) {
  return {{"mode", o.mode},
          {"methods", o.methods},
          {"level", o.level},
          {"batches", o.batches},
          {"lengths", o.lengths},
          {"device", o.device},
          {"dtype", o.dtype},
          {"preset", o.preset},
          {"config", o.config},
          {"reps", o.reps},
          {"warmup", o.warmup},
          {"memory_limit_bytes", o.memory_limit > 0 ? Json(o.memory_limit) : Json(nullptr)},
          {"optimizer", o.mode == "train"
                            ? Json(fmt::format("plain in-place SGD update (lr {}) standing in for the optimizer step "
                                               "until Muon lands", o.sgd_lr))
                            : Json(nullptr)},
          {"flops_convention",
           o.mode == "train"    ? "accountant forward FLOPs x3 (forward + backward)"
           : o.mode == "decode" ? "accountant decode FLOPs per token at context c, B tokens per step"
           : o.level == "model" ? "accountant forward FLOPs (executed, exact causal pairs), lm_head on the last position only"
                                : "accountant forward FLOPs (executed, exact causal pairs)"}};
}

// ------------------------------------------------------------------ the sweep
Json run_sweep(const SweepOptions& opt, SweepSummary& sum) {
  Registry& reg = Registry::get();
  Json results = Json::array();
  const bool train = opt.mode == "train";
  auto base = [&](const std::string& method, const std::string& op) {
    return Json{{"method", method}, {"op", op.empty() ? Json(nullptr) : Json(op)}, {"level", opt.level},
                {"mode", opt.mode}, {"device", opt.device}, {"dtype", opt.dtype}};
  };

  std::vector<Unit> units;
  if (opt.level == "op") {
    std::set<std::string> seen;
    for (const auto& name : opt.methods)
      for (const auto& o : reg.method(name).ops)
        if (seen.insert(o).second) units.push_back(op_unit(name, reg.op(o), opt));
  } else {
    for (const auto& name : opt.methods) {
      const MethodSpec& m = reg.method(name);
      if (opt.mode == "decode" && !m.has_decode()) {
        Json r = base(name, "");
        r["status"] = "skipped";
        r["reason"] = "no decode path";
        r["message"] = m.is_hybrid() ? "a layer method of this hybrid registers no decode step"
                                     : "the method registers no decode step with a KV cache or recurrent state";
        r["shape"] = Json::object();
        results.push_back(r);
        ++sum.skipped;
        continue;
      }
      units.push_back(opt.mode == "decode" ? decode_unit(m, opt) : opt.level == "model" ? model_unit(m, opt) : layer_unit(m, opt));
    }
  }

  for (Unit& u : units) {
    if (opt.device == "cuda") {
      const bool has = u.op.empty() ? method_has_cuda(reg.method(u.method)) : bool(reg.op(u.op).cuda);
      if (!has) {
        Json r = base(u.method, u.op);
        r["status"] = "skipped";
        r["reason"] = "no CUDA path";
        r["shape"] = Json::object();
        results.push_back(r);
        ++sum.skipped;
        continue;
      }
    }
    const std::string unit_name = u.op.empty() ? u.method : u.method + "/" + u.op;
    for (int64_t B : opt.batches) {
      std::optional<int64_t> last_fit;
      for (int64_t T : opt.lengths) {
        const std::string nv = fmt::format("{}/sweep/{}:B{}T{}", u.op.empty() ? u.method : u.op, opt.mode, B, T);
        Json r = base(u.method, u.op);
        Prediction pred;
        std::string oom_reason, oom_message;
        auto t_start = std::chrono::steady_clock::now();
        try {
          pred = u.predict(B, T);
          r["shape"] = pred.shape;
          r["config"] = pred.config;
          if (opt.memory_limit > 0 && pred.bytes > opt.memory_limit)
            throw OutOfMemory(fmt::format("predicted {} exceeds --memory-limit {}", fmt_bytes(pred.bytes),
                                          fmt_bytes(opt.memory_limit)));
          NvtxRange range(nv);
          MemProbe mem{opt.device};
          Json timing, memory;
          std::function<Json()> measured;
          {
            {
              // The model or layer is built on first use, before the probe, so the delta is the point's.
              NvtxRange setup(nv + "/setup");
              u.setup(T);
            }
            mem.start();
            Point pt = u.prepare(B, T);
            std::vector<double> s = time_reps(pt, opt, nv);
            measured = pt.measured;
            sync_device(opt.device);
            memory = mem.finish();
            timing = timing_json(s, opt.warmup);
          }
          const double med = timing["median_s"].get<double>();
          const double tokens = opt.mode == "decode" ? double(B) : double(B * T);  // per repetition
          r["status"] = "ok";
          r["timing"] = timing;
          r["tokens_per_s"] = tokens / med;
          Json acct = {{"predicted_bytes", pred.bytes}, {"predicted_bytes_formula", pred.bytes_formula}};
          if (std::isfinite(pred.fwd_flops_per_token)) {
            const double fpt = pred.fwd_flops_per_token * (train ? 3.0 : 1.0);
            acct["fwd_flops_per_token"] = pred.fwd_flops_per_token;
            acct["flops_per_token"] = fpt;
            acct["flops_per_step"] = fpt * tokens;
            r["flop_per_s"] = fpt * tokens / med;
          } else {
            acct["fwd_flops_per_token"] = nullptr;
            acct["flops_per_token"] = nullptr;
            acct["flops_per_step"] = nullptr;
            r["flop_per_s"] = nullptr;
          }
          for (auto it = pred.extra_accountant.begin(); it != pred.extra_accountant.end(); ++it) acct[it.key()] = it.value();
          r["accountant"] = acct;
          if (opt.mode == "decode") r["latency_per_token_s"] = med;
          if (measured) r["cache"] = measured();
          r["memory"] = memory;
          last_fit = T;
          ++sum.ok;
        } catch (const OutOfMemory& e) {
          oom_reason = "memory limit";
          oom_message = e.what();
        } catch (const c10::OutOfMemoryError& e) {
          oom_reason = "out of memory";
          oom_message = e.what_without_backtrace();
        } catch (const std::bad_alloc& e) {
          oom_reason = "out of memory";
          oom_message = e.what();
        } catch (const InputError& e) {
          r["status"] = "error";
          r["message"] = e.what();
          ++sum.errors;
        } catch (const c10::Error& e) {
          const std::string msg = e.what_without_backtrace();
          if (is_oom_message(msg)) {
            oom_reason = "out of memory";
            oom_message = msg;
          } else {
            r["status"] = "error";
            r["message"] = msg;
            ++sum.errors;
          }
        } catch (const std::exception& e) {
          r["status"] = "error";
          r["message"] = e.what();
          ++sum.errors;
        }
        r["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (!r.contains("shape")) r["shape"] = Json{{"B", B}, {"T", T}};
        if (!oom_reason.empty()) {
          u.release();
          free_device_cache(opt.device);
          r["status"] = "oom";
          r["reason"] = oom_reason;
          r["message"] = oom_message;
          r["last_fit_T"] = last_fit ? Json(*last_fit) : Json(nullptr);
          if (std::isfinite(pred.bytes))
            r["accountant"] = {{"predicted_bytes", pred.bytes}, {"predicted_bytes_formula", pred.bytes_formula}};
          ++sum.oom;
        }
        if (opt.progress) {
          const std::string st = r["status"];
          if (st == "ok")
            std::cerr << fmt::format("sweep {} {} B={} T={}: {:.4g} s median, {:.4g} tokens/s\n", opt.mode, unit_name,
                                     B, T, r["timing"]["median_s"].get<double>(), r["tokens_per_s"].get<double>());
          else
            std::cerr << fmt::format("sweep {} {} B={} T={}: {} ({})\n", opt.mode, unit_name, B, T, st,
                                     r.value("reason", r.value("message", std::string())));
        }
        results.push_back(r);
        if (r["status"] == "oom") break;  // the frontier for this batch size; on to the next one
      }
    }
  }
  return results;
}

}  // namespace mixbench
