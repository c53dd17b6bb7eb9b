#include "suites/sweep_units.h"
#include "suites/sweep_ranges.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <optional>

#include "harness/decode_ops.h"
#include "harness/args.h"
#include "harness/backbone.h"
#include "harness/decode_graph.h"
#include "harness/errors.h"
#include "harness/metrics.h"
#include "harness/nvtx.h"

namespace mixbench::sweep_detail {

namespace {

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

}  // namespace

std::optional<Model> control_model(const Model& m) {
  const MethodSpec& method = *m.method;
  if (!method.residual || method.control.empty()) return std::nullopt;
  const MethodSpec& c = Registry::get().method(method.control);
  if (!c.residual) return std::nullopt;
  Model out = m;
  out.stream = c.residual(m.cfg);
  return out;
}

// The residual stream's share of the model's forward FLOPs per token: its own arithmetic
// (ResidualStream::fwd_flops) plus 2 FLOPs per parameter of its matmul parameters (the
// accountant's 2·N), over the accountant's forward FLOPs.
double stream_flop_share(const MethodSpec& method, const Config& cfg, int64_t T, int64_t dtype_bytes) {
  const auto stream = model_stream(method, cfg);
  const ModelDims d = model_dims(cfg);
  const ExecPlan plan = model_plan(method, cfg);
  double f = stream->fwd_flops(d, plan);
  for (const ParamDef& p : stream->params(d, plan)) {
    if (!p.matmul) continue;
    double n = 1;
    for (int64_t s : p.shape) n *= double(s);
    f += 2.0 * n;
  }
  CostQuery q;
  q.T = T;
  q.context = T;
  q.dtype_bytes = dtype_bytes;
  return f / account_model(method, cfg, q).fwd_flops;
}

namespace {
std::atomic<int64_t> g_models_held{0}, g_models_held_peak{0};
void note_model_built() {
  const int64_t h = ++g_models_held;
  int64_t p = g_models_held_peak.load();
  while (h > p && !g_models_held_peak.compare_exchange_weak(p, h)) {
  }
}
// Drops `model` (if held) and counts it.
void drop_model(std::optional<Model>& model) {
  if (!model) return;
  model.reset();
  --g_models_held;
}
}  // namespace

int64_t models_held() { return g_models_held.load(); }
int64_t models_held_peak() { return g_models_held_peak.load(); }
void reset_models_held_peak() { g_models_held_peak = g_models_held.load(); }

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
    Config cfg = sweep_method_config(method, opt, T);
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
      p.fwd_flops_per_token += mc.aux_route_fwd_flops;  // a training pass runs the auxiliary routes too
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
    Config cfg = sweep_method_config(method, opt, T);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    Model m = build_model(method, cfg, gen, at::TensorOptions().dtype(at::kFloat));
    TensorMap moved;
    for (const auto& [n, p] : m.params) moved.set(n, p.to(device_of(opt.device), dt).detach());
    m.params = std::move(moved);
    st->model = std::move(m);
    note_model_built();
  };
  u.prepare = [&method, opt, st, train, eb](int64_t B, int64_t T) {
    Config cfg = sweep_method_config(method, opt, T);
    const at::Device dev = device_of(opt.device);
    const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
    Model& m = *st->model;
    set_model_config(m, cfg);  // parameters do not depend on seq_len; windows may
    for (auto& [n, p] : m.params) p.requires_grad_(train);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    at::Tensor idx = at::randint(m.dims.vocab, {B, T}, gen, lopts).to(dev);
    at::Tensor tgt = train ? at::randint(m.dims.vocab, {B, T}, gen, lopts).to(dev) : at::Tensor();
    const double lr = opt.sgd_lr;
    auto run = [idx, tgt, train, backend, lr](Model& m, const std::string& nv) {
      if (!train) {
        c10::NoGradGuard ng;
        NvtxRange r(sweep_phase_range(nv, "forward"));
        model_prefill(m, idx, backend);
        return;
      }
      at::Tensor loss;
      {
        NvtxRange r(sweep_phase_range(nv, "forward"));
        loss = model_loss(m, idx, tgt, backend);
      }
      {
        NvtxRange r(sweep_phase_range(nv, "backward"));
        loss.backward();
      }
      NvtxRange r(sweep_phase_range(nv, "update"));
      sgd_update(m.params, lr);
    };
    Point pt;
    pt.step = [st, run](const std::string& nv) { run(*st->model, nv); };
    if (std::optional<Model> c = control_model(m)) {
      auto cm = std::make_shared<Model>(std::move(*c));
      pt.control = [cm, run](const std::string& nv) { run(*cm, nv); };
      pt.control_info = {{"stream", m.stream->name()}, {"control_stream", cm->stream->name()},
                         {"flop_share", stream_flop_share(method, cfg, T, eb)}};
    }
    return pt;
  };
  u.release = [st] {
    if (st->model) drop_grads(st->model->params);
  };
  u.finish = [st] { drop_model(st->model); };
  return u;
}

// Decode at model level: per point (B, c) the model prefills c tokens into its caches (untimed),
// then each repetition is one decode step of B tokens (the context grows by one per step).
Unit decode_unit(const MethodSpec& method, const SweepOptions& opt) {
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const int64_t eb = int64_t(c10::elementSize(dt));
  struct State {
    std::optional<Model> model;
    // the captured step of the current point (CUDA, static caches), and its cache
    std::unique_ptr<ModelCache> cache;
    std::unique_ptr<DecodeGraph> graph;
  };
  auto cs = std::make_shared<State>();
  Unit u;
  u.method = method.name;
  u.predict = [&method, opt, eb](int64_t B, int64_t c) {
    Config cfg = sweep_method_config(method, opt, c);
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
    const double tables = double(mc.params.wte + mc.params.value_embeds);
    p.step_weight_bytes = (double(mc.params.total()) - tables) * double(eb);
    p.step_embedding_row_bytes = tables / double(d.vocab) * double(B) * double(eb);  // one row per table per token
    p.extra_accountant = {{"context", c},
                          {"decode_flops_per_token", mc.decode_flops},
                          {"cache_bytes", cache},
                          {"cache_bytes_formula", "(kv_cache_bytes/token·c + state_bytes)·B"},
                          {"kv_cache_bytes_per_token", mc.cache_bytes_per_token},
                          {"state_bytes", mc.state_bytes},
                          {"cache_read_bytes", mc.decode_read_bytes * double(B)}};
    p.shape = {{"B", B}, {"T", c}, {"context", c}, {"n_layer", d.n_layer}, {"d_model", d.d_model},
               {"n_head", d.n_head}, {"head_dim", d.head_dim}, {"vocab", d.vocab}};
    p.config = cfg.to_json();
    return p;
  };
  u.setup = [&method, opt, cs, dt](int64_t c) {
    if (cs->model) return;
    Config cfg = sweep_method_config(method, opt, c);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    Model m = build_model(method, cfg, gen, at::TensorOptions().dtype(at::kFloat));
    TensorMap moved;
    for (const auto& [n, p] : m.params) moved.set(n, p.to(device_of(opt.device), dt).detach());
    m.params = std::move(moved);
    cs->model = std::move(m);
    note_model_built();
  };
  u.prepare = [&method, opt, cs](int64_t B, int64_t c) {
    c10::NoGradGuard ng;
    const at::Device dev = device_of(opt.device);
    const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
    Model& m = *cs->model;
    set_model_config(m, sweep_method_config(method, opt, c));  // windows follow seq_len = c
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed + 1);
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    at::Tensor idx = at::randint(m.dims.vocab, {B, c}, gen, lopts).to(dev);
    cs->graph.reset();
    cs->cache.reset();
    std::string no_graph;  // why this point decodes eagerly
    if (opt.device != "cuda") no_graph = "CUDA graphs run on CUDA only";
    else if (opt.graph == "off") no_graph = "--graph off";
    else if (!model_has_static_decode(m)) no_graph = "the method keeps no static decode cache";
    if (no_graph.empty()) {
      // The step captured once for the point: static caches sized for the prefill, the warm-up step
      // and every timed step; the position on the device.
      const int64_t capacity = c + int64_t(opt.warmup + opt.reps) + 2;
      cs->cache = std::make_unique<ModelCache>();
      at::Tensor first = model_prefill(m, idx, backend, cs->cache.get(), capacity).argmax(-1);
      const int64_t after_prefill = cs->cache->bytes();
      try {
        cs->graph = std::make_unique<DecodeGraph>(m, *cs->cache, first);
      } catch (const std::runtime_error& e) {  // the capture failed: this point decodes eagerly
        no_graph = e.what();
        cs->cache.reset();
      }
      if (cs->graph) {
        Point pt;
        pt.step = [cs](const std::string& nv) {
          NvtxRange r(sweep_phase_range(nv, "decode"));
          cs->graph->step();
        };
        pt.measured = [cs, after_prefill, c, capacity]() -> Json {
          Json m = {{"bytes_after_prefill", after_prefill}, {"context_after_prefill", c},
                    {"bytes_at_end", cs->cache->bytes()}, {"context_at_end", cs->cache->pos},
                    {"static_capacity", capacity}, {"cuda_graph", true},
                    // what one step launches: the captured graph's kernel nodes (and all its nodes)
                    {"graph_kernels_per_step", cs->graph->nodes().kernels},
                    {"graph_nodes_per_step", cs->graph->nodes().launches() + cs->graph->nodes().other}};
          m.update(decode_knobs_json());  // the decode kernels' settings the step was captured with
          return m;
        };
        return pt;
      }
    }
    auto cache = std::make_shared<ModelCache>();
    at::Tensor logits = model_prefill(m, idx, backend, cache.get());
    const int64_t after_prefill = cache->bytes();
    auto next = std::make_shared<at::Tensor>(logits.argmax(-1));  // greedy: [B,1]
    Point pt;
    pt.step = [cs, cache, next, backend](const std::string& nv) {
      c10::NoGradGuard ng;
      NvtxRange r(sweep_phase_range(nv, "decode"));
      *next = model_decode_step(*cs->model, *next, *cache, backend).argmax(-1);
    };
    pt.measured = [cache, after_prefill, c, no_graph]() -> Json {
      return {{"bytes_after_prefill", after_prefill}, {"context_after_prefill", c},
              {"bytes_at_end", cache->bytes()}, {"context_at_end", cache->pos},
              {"cuda_graph", false}, {"cuda_graph_note", no_graph}};
    };
    return pt;
  };
  u.release = [cs] {
    cs->graph.reset();
    cs->cache.reset();
    drop_model(cs->model);
  };
  u.finish = u.release;
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
    Config cfg = sweep_method_config(method, opt, T);
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
    Config cfg = sweep_method_config(method, opt, T);
    LayerCtx ctx{0, model_dims(cfg).n_layer};
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
    for (const auto& def : method.params(cfg, ctx))
      st->params.set(def.name,
                     random_param(def, gen, at::TensorOptions().dtype(at::kDouble)).to(device_of(opt.device), dt).detach());
  };
  u.prepare = [&method, opt, st, dt, train, backend](int64_t B, int64_t T) {
    Config cfg = sweep_method_config(method, opt, T);
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
      ScopedMethod sm(method.name);  // the layer's op ranges carry its name
      TensorMap in = inputs;
      for (const auto& [n, p] : st->params) in.set(n, p);
      if (!train) {
        c10::NoGradGuard ng;
        NvtxRange r(sweep_phase_range(nv, "forward"));
        method.forward(in, cfg, ctx, backend);
        return;
      }
      at::Tensor loss;
      {
        NvtxRange r(sweep_phase_range(nv, "forward"));
        loss = (method.forward(in, cfg, ctx, backend).at("y") * dy).sum();
      }
      {
        NvtxRange r(sweep_phase_range(nv, "backward"));
        loss.backward();
      }
      NvtxRange r(sweep_phase_range(nv, "update"));
      sgd_update(st->params, lr);
      inputs.at("x").mutable_grad().reset();
    };
    return pt;
  };
  u.release = [st] { drop_grads(st->params); };
  u.finish = [st] { st->params = TensorMap(); };
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
        NvtxRange r(sweep_phase_range(nv, "forward"));
        call_op(op.name, backend, inputs, cfg);
        return;
      }
      at::Tensor loss;
      {
        NvtxRange r(sweep_phase_range(nv, "forward"));
        for (const auto& [n, o] : call_op(op.name, backend, inputs, cfg))
          if (floating(o) && o.requires_grad()) loss = loss.defined() ? loss + o.sum() : o.sum();
      }
      if (loss.defined()) {
        NvtxRange r(sweep_phase_range(nv, "backward"));
        loss.backward();
      }
      for (const auto& [n, t] : inputs)
        if (t.grad().defined()) const_cast<at::Tensor&>(t).mutable_grad().reset();
    };
    return pt;
  };
  u.setup = [](int64_t) {};
  u.finish = [] {};
  u.release = [] {};
  return u;
}

bool method_has_cuda(const MethodSpec& m) {
  bool ok = m.has_cuda;
  for (const auto& o : m.ops) ok = ok && Registry::get().has_op(o) && bool(Registry::get().op(o).cuda);
  return ok;
}

}  // namespace mixbench::sweep_detail
