#include "suites/unit_golden.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <set>
#include <type_traits>
#include <variant>

#include "harness/alloc.h"
#include "harness/errors.h"
#include "harness/foreign_names.h"
#include "harness/metrics.h"
#include "suites/conformance_subject.h"
#include "suites/golden.h"
#include "suites/model_golden.h"

namespace mixbench {

using namespace conformance_detail;

namespace {

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);

// The first layer without a value embedding (the part every implementation shares), else 0.
int64_t default_layer(const MethodSpec& m, const Config& cfg) {
  const int64_t L = cfg.i("n_layer");
  for (int64_t i = 0; i < L; ++i) {
    const LayerCtx ctx{i, L};
    if (!m.ve_dim || m.ve_dim(cfg, ctx) == 0) return i;
  }
  return 0;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_of(const std::vector<ParamDef>& defs) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& d : defs) out.emplace_back(d.name, d.shape);
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_of(const Model& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [n, t] : m.params) out.emplace_back(n, t.sizes().vec());
  return out;
}

const std::set<std::string>& model_outputs() {
  static const std::set<std::string> s = {"logits", "aux_loss", "exit_logits", "exit_probs"};
  return s;
}

// The parameters' aliases for the file's scheme (empty for mixbench's own names).
ParamAliases aliases_for(const MethodSpec& m, const Config& cfg, const std::string& level, const LayerCtx& ctx,
                         const std::string& names) {
  if (names.empty() || names == "mixbench") return {};
  return level == "layer" ? layer_aliases(m, cfg, ctx, names) : model_aliases(m, cfg, names);
}


}  // namespace

std::map<std::string, std::string> config_metadata(const ConfigSpec& spec, const Config& cfg) {
  std::map<std::string, std::string> meta;
  for (const auto& f : spec.fields()) {
    const auto& v = cfg.values().at(f.name);
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, std::string>) meta[f.name] = x;
      else if constexpr (std::is_same_v<T, bool>) meta[f.name] = x ? "true" : "false";
      else if constexpr (std::is_same_v<T, double>) meta[f.name] = fmt::format("{:.17g}", x);
      else meta[f.name] = std::to_string(x);
    }, v);
  }
  return meta;
}

Config config_from_metadata(const MethodSpec& m, const std::map<std::string, std::string>& meta, const std::string& where) {
  std::string overrides;
  for (const auto& [k, v] : meta) {
    if (!m.config.find(k)) continue;
    if (v.find(',') != std::string::npos)
      throw InputError(fmt::format("{}: metadata field '{}' = '{}' holds a comma", where, k, v));
    overrides += (overrides.empty() ? "" : ",") + k + "=" + v;
  }
  try {
    return m.config.parse(overrides);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", where, e.what()));
  }
}

SafetensorsFile make_unit_golden(const UnitGoldenRequest& req) {
  const MethodSpec& m = Registry::get().method(req.method);
  if (req.level != "layer" && req.level != "model") throw UsageError("--level takes layer or model");
  if (!req.names.empty() && req.names != "mixbench") check_scheme(req.names);
  if (req.batch < 1 || req.seq_len < 1) throw UsageError("--batch and --seq-len must be positive");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(req.seed);
  const Config base = req.level == "model" ? model_golden_config(m) : m.cases().front().cfg;
  const Config cfg = m.config.parse(req.config, &base);
  const int64_t L = cfg.i("n_layer");
  TensorMap in;
  std::vector<std::string> params;
  Unit u;
  LayerCtx ctx{0, L};
  std::optional<Model> proto;
  if (req.level == "layer") {
    if (m.model_level())
      throw UsageError(fmt::format("method {} is checked as a whole model (a hybrid, a loop or its own residual "
                                   "stream): use --level model", m.name));
    const int64_t layer = req.layer >= 0 ? req.layer : default_layer(m, cfg);
    if (layer >= L) throw UsageError(fmt::format("--layer {} is beyond the model's {} layers", layer, L));
    ctx = LayerCtx{layer, L};
    in = m.make_inputs(cfg, ctx, req.batch, req.seq_len, gen);
    for (const auto& def : m.params(cfg, ctx)) {
      in.set(def.name, random_param(def, gen, kF64));
      params.push_back(def.name);
    }
    u = layer_unit(m, cfg, ctx);
  } else {
    proto = build_model(m, cfg, gen, kF64, /*random_nonzero=*/true);
    in.set("idx", at::randint(proto->dims.vocab, {req.batch, req.seq_len}, gen, at::TensorOptions().dtype(at::kLong)));
    for (const auto& [n, t] : proto->params) {
      in.set(n, t);
      params.push_back(n);
    }
    u = model_unit(m, *proto);
  }
  const ParamAliases aliases = aliases_for(m, cfg, req.level, ctx, req.names);
  TensorMap x = prepare(in, u, at::kDouble, at::Device(at::kCPU), true);
  TensorMap outs = u.reference(x);
  TensorMap cot;
  at::Tensor loss;
  for (const auto& [n, o] : outs) {
    if (!at::isFloatingType(o.scalar_type()) || !o.requires_grad()) continue;
    at::Tensor d = at::randn(o.sizes(), gen, kF64);
    cot.set(n, d);
    at::Tensor term = (o * d).sum();
    loss = loss.defined() ? loss + term : term;
  }
  std::vector<at::Tensor> diff;
  std::vector<std::string> diff_names;
  for (const auto& [n, t] : x)
    if (t.requires_grad()) {
      diff.push_back(t);
      diff_names.push_back(n);
    }
  std::vector<at::Tensor> g;
  if (loss.defined()) g = torch::autograd::grad({loss}, diff, {}, false, false, /*allow_unused=*/true);

  SafetensorsFile f;
  TensorMap ours_params, ours_grads;
  const std::set<std::string> pset(params.begin(), params.end());
  for (const auto& [n, t] : in)
    if (!pset.count(n)) f.tensors.set(n, t.detach());
  for (const auto& n : params) ours_params.set(n, in.at(n).detach());
  for (size_t i = 0; i < diff.size(); ++i) {
    at::Tensor gi = g.empty() || !g[i].defined() ? at::zeros_like(diff[i]) : g[i];
    if (pset.count(diff_names[i])) ours_grads.set(diff_names[i], gi.detach());
    else f.tensors.set("grad_" + diff_names[i], gi.detach());
  }
  const bool foreign = !req.names.empty() && req.names != "mixbench";
  TensorMap p_out = foreign ? to_foreign(ours_params, aliases, req.names) : ours_params;
  TensorMap g_out = foreign ? to_foreign(ours_grads, aliases, req.names) : ours_grads;
  for (const auto& [n, t] : p_out) f.tensors.set(n, t);
  // floating outputs only: a layer's selection (harness/method_selection.h) is not part of the file
  for (const auto& [n, o] : outs)
    if (at::isFloatingType(o.scalar_type())) f.tensors.set(n, o.detach());
  for (const auto& [n, d] : cot) f.tensors.set("d" + n, d);
  for (const auto& [n, t] : g_out) f.tensors.set("grad_" + n, t);
  f.metadata = config_metadata(m.config, cfg);
  f.metadata["method"] = m.name;
  f.metadata["level"] = req.level;
  if (req.level == "layer") f.metadata["layer"] = std::to_string(ctx.layer);
  f.metadata["names"] = foreign ? req.names : "mixbench";
  f.metadata["seed"] = std::to_string(req.seed);
  f.metadata["source"] = "mixbench golden: the method's FP64 reference";
  return f;
}

size_t write_unit_golden(const UnitGoldenRequest& req, const std::string& path) {
  const SafetensorsFile f = make_unit_golden(req);
  write_safetensors(path, f.tensors, f.metadata);
  return f.tensors.size();
}

bool is_unit_golden(const SafetensorsFile& f) { return f.metadata.count("level") > 0; }

UnitGolden read_unit_golden(const std::string& path) { return read_unit_golden(read_safetensors(path), path); }

UnitGolden read_unit_golden(const SafetensorsFile& f, const std::string& path) {
  auto fail = [&](const std::string& why) { return golden_file_error(path, why); };
  const std::string where = fmt::format("golden file '{}'", path);
  UnitGolden g;
  g.metadata = f.metadata;
  auto meta = [&](const std::string& k) -> std::string {
    auto it = f.metadata.find(k);
    if (it == f.metadata.end()) throw fail(fmt::format("metadata has no '{}'", k));
    return it->second;
  };
  g.level = meta("level");
  if (g.level != "layer" && g.level != "model")
    throw fail(fmt::format("metadata 'level' is '{}' (layer or model)", g.level));
  const std::string method = meta("method");
  if (!Registry::get().has_method(method)) {
    std::vector<std::string> known;
    for (const MethodSpec* m : Registry::get().methods()) known.push_back(m->name);
    const auto near = closest_names(method, known, 1);
    throw fail(fmt::format("metadata names method '{}', which is not registered{}", method,
                           near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near[0])));
  }
  const MethodSpec& m = Registry::get().method(method);
  g.method = &m;
  g.cfg = config_from_metadata(m, f.metadata, where);
  g.names = f.metadata.count("names") ? f.metadata.at("names") : "mixbench";
  if (g.names != "mixbench") {
    try {
      check_scheme(g.names);
    } catch (const UsageError& e) {
      throw fail(e.what());
    }
  }
  const ModelDims d = model_dims(g.cfg);
  const int64_t L = d.n_layer;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  std::set<std::string> input_names, output_names;
  std::optional<Model> proto;
  if (g.level == "layer") {
    if (m.model_level()) throw fail(fmt::format("method {} has no layer of its own: its goldens are at level model", m.name));
    int64_t layer = 0;
    try {
      layer = std::stoll(meta("layer"));
    } catch (const std::logic_error&) {
      throw fail(fmt::format("metadata 'layer' = '{}' is not an integer", f.metadata.at("layer")));
    }
    if (layer < 0 || layer >= L) throw fail(fmt::format("metadata 'layer' {} is outside the model's {} layers", layer, L));
    g.ctx = LayerCtx{layer, L};
    expected = shapes_of(m.params(g.cfg, g.ctx));
    input_names = {"x", "ve"};
    output_names = {"y"};
  } else {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    proto = build_model(m, g.cfg, gen, kF64, /*random_nonzero=*/true);
    expected = shapes_of(*proto);
    input_names = {"idx"};
    output_names = model_outputs();
  }
  ParamAliases aliases;
  try {
    aliases = aliases_for(m, g.cfg, g.level, g.ctx, g.names);
  } catch (const UsageError& e) {
    throw fail(e.what());
  }
  const std::string scheme = g.names == "mixbench" ? "" : g.names;
  // Sort the tensors: inputs, outputs, cotangents, gradients; the rest are parameters.
  TensorMap params, grads_theirs;
  for (const auto& [n, t] : f.tensors) {
    if (input_names.count(n) || output_names.count(n)) continue;
    if (n.size() > 1 && n[0] == 'd' && output_names.count(n.substr(1))) continue;
    if (n.rfind("grad_", 0) == 0) {
      grads_theirs.set(n.substr(5), t);
      continue;
    }
    if (t.numel() > 0 && !at::isFloatingType(t.scalar_type()))
      throw fail(fmt::format("parameter tensor '{}' is not floating point", n));
    params.set(n, t);
  }
  TensorMap ours = from_foreign(params, aliases, expected, scheme, where);
  // inputs
  auto floating64 = [](const at::Tensor& t) { return t.to(at::kDouble); };
  if (g.level == "layer") {
    if (!f.tensors.has("x")) throw fail("missing input tensor 'x'");
    const at::Tensor& x = f.tensors.at("x");
    if (x.dim() != 3 || x.size(2) != d.d_model || !at::isFloatingType(x.scalar_type()))
      throw fail(fmt::format("input 'x' has shape {} but the config implies [B, T, {}] (floating point)",
                             c10::str(x.sizes()), d.d_model));
    g.inputs.set("x", floating64(x));
    const int64_t ve = m.ve_dim ? m.ve_dim(g.cfg, g.ctx) : 0;
    if (ve > 0) {
      if (!f.tensors.has("ve")) throw fail(fmt::format("missing input tensor 've' (layer {} has a value embedding)", g.ctx.layer));
      const at::Tensor& v = f.tensors.at("ve");
      if (v.sizes().vec() != std::vector<int64_t>{x.size(0), x.size(1), ve})
        throw fail(fmt::format("input 've' has shape {} but the config implies [{}, {}, {}]", c10::str(v.sizes()),
                               x.size(0), x.size(1), ve));
      g.inputs.set("ve", floating64(v));
    } else if (f.tensors.has("ve")) {
      throw fail(fmt::format("tensor 've' given but layer {} has no value embedding", g.ctx.layer));
    }
  } else {
    if (!f.tensors.has("idx")) throw fail("missing input tensor 'idx'");
    const at::Tensor& idx = f.tensors.at("idx");
    if (idx.dim() != 2 || at::isFloatingType(idx.scalar_type()) || idx.numel() == 0)
      throw fail(fmt::format("input 'idx' has shape {} and dtype {}; the model takes integer token ids [B, T]",
                             c10::str(idx.sizes()), c10::toString(idx.scalar_type())));
    const int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
    if (lo < 0 || hi >= d.vocab)
      throw fail(fmt::format("input 'idx' holds token {} outside the vocabulary of {}", lo < 0 ? lo : hi, d.vocab));
    g.inputs.set("idx", idx.to(at::kLong));
  }
  for (const auto& [n, t] : ours) g.inputs.set(n, floating64(t));
  // expected outputs and cotangents
  const at::Tensor& first = g.level == "layer" ? g.inputs.at("x") : g.inputs.at("idx");
  for (const auto& o : output_names) {
    if (!f.tensors.has(o)) continue;
    const at::Tensor& t = f.tensors.at(o);
    if (o == "y" && t.sizes() != first.sizes())
      throw fail(fmt::format("output 'y' has shape {} but the input x has {}", c10::str(t.sizes()), c10::str(first.sizes())));
    if (o == "logits" && t.sizes().vec() != std::vector<int64_t>{first.size(0), first.size(1), d.vocab})
      throw fail(fmt::format("output 'logits' has shape {} but the config implies [{}, {}, {}]", c10::str(t.sizes()),
                             first.size(0), first.size(1), d.vocab));
    g.expected.set(o, floating64(t));
    if (f.tensors.has("d" + o)) {
      const at::Tensor& c = f.tensors.at("d" + o);
      if (c.sizes() != t.sizes())
        throw fail(fmt::format("cotangent 'd{}' has shape {} but '{}' has {}", o, c10::str(c.sizes()), o, c10::str(t.sizes())));
      g.cotangents.set(o, floating64(c));
    }
  }
  if (g.expected.empty()) throw fail(g.level == "layer" ? "holds no expected output 'y'" : "holds no expected output 'logits'");
  // expected gradients, under our names
  TensorMap gparams;
  for (const auto& [n, t] : grads_theirs) {
    if (g.inputs.has(n) && (n == "x" || n == "ve")) {
      if (t.sizes() != g.inputs.at(n).sizes())
        throw fail(fmt::format("tensor 'grad_{}' has shape {} but the input has {}", n, c10::str(t.sizes()),
                               c10::str(g.inputs.at(n).sizes())));
      g.gradients.set("grad_" + n, floating64(t));
    } else {
      gparams.set(n, t);
    }
  }
  try {
    for (const auto& [n, t] : from_foreign(gparams, aliases, expected, scheme, where, /*require_all=*/false))
      g.gradients.set("grad_" + n, floating64(t));
  } catch (const InputError& e) {
    throw fail(fmt::format("a gradient: {}", e.what()));
  }
  for (const auto& [n, t] : f.tensors)
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kDouble) g.dtype = "fp32";
  return g;
}

nlohmann::json run_unit_golden(const std::string& path, const ConformanceOptions& opt) {
  const UnitGolden g = read_unit_golden(path);
  const MethodSpec& m = *g.method;
  std::optional<Model> proto;
  Unit u;
  if (g.level == "layer") {
    u = layer_unit(m, g.cfg, g.ctx);
  } else {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    proto = build_model(m, g.cfg, gen, kF64, /*random_nonzero=*/true);
    u = model_unit(m, *proto);
  }
  const at::Tensor& first = g.inputs.at(g.level == "layer" ? "x" : "idx");
  Json results = Json::array();
  for (int pass = 0; pass < 2; ++pass) {
    const bool reference = pass == 0;
    const std::string dtype = reference ? "fp64" : opt.dtype;
    Json base = {{"method", m.name}, {"op", nullptr}, {"level", "golden"}, {"case", path},
                 {"device", reference ? "cpu" : (opt.backend == Backend::CUDA ? "cuda" : "cpu")},
                 {"dtype", dtype}, {"backend", reference ? "reference" : backend_name(opt.backend)},
                 {"config", g.cfg.to_json()}, {"shape", shape_json(first.size(0), first.size(1), g.inputs)}};
    base["golden_level"] = g.level;
    base["names"] = g.names;
    if (g.level == "layer") base["layer"] = g.ctx.layer;
    else base["layer_mixers"] = proto->layer_mixers;
    if (!reference && opt.backend == Backend::CUDA && !m.has_cuda) {
      base["status"] = "skipped";
      base["reason"] = "no CUDA path registered";
      results.push_back(base);
      continue;
    }
    results.push_back(guarded(base, [&]() -> Json {
      const at::ScalarType dt = parse_dtype(dtype);
      const at::Device dev = reference ? at::Device(at::kCPU) : device_of(opt.backend);
      TensorMap x = prepare(g.inputs, u, reference ? at::kDouble : dt, dev, reference);
      TensorMap cot;
      for (const auto& [n, t] : g.cotangents) cot.set(n, t.to(dt).to(dev));
      TensorMap outs, grads;
      {
        PoisonScope poison(!reference);
        std::tie(outs, grads) = forward_backward(u, x, cot, reference ? Backend::Reference : opt.backend, reference);
      }
      if (!reference && opt.fault == "output") outs = inject_fault(outs, opt.fault_scale);
      if (!reference && opt.fault == "gradient") grads = inject_fault(grads, opt.fault_scale);
      auto thr = [&](TensorKind k) {
        return std::max(check_threshold(dtype, k, g.level), check_threshold(g.dtype, k, g.level));
      };
      // A gradient is compared relative to the larger of its own RMS and the RMS of all the file's
      // gradients (as the model goldens, suites/model_golden.h): some are rounding noise of a
      // quantity zero in exact arithmetic (the backout gain of a 2-layer model, whose kept state is
      // the final one: the final norm cancels its scale), which no two implementations round alike.
      double sq = 0, count = 0;
      for (const auto& [n, want] : g.gradients) {
        sq += want.pow(2).sum().item<double>();
        count += double(want.numel());
      }
      const double scale = count > 0 ? std::sqrt(sq / count) : 0.0;
      auto measure = [&](const at::Tensor& want, const at::Tensor& got, bool gradient) {
        Comparison cmp = compare(want, got);
        const double own = want.pow(2).mean().sqrt().item<double>();
        if (gradient && cmp.shape_ok && cmp.finite && own < scale) {
          cmp.rel_rms = (want - got.to(at::kCPU, at::kDouble)).pow(2).mean().sqrt().item<double>() / scale;
          cmp.absolute = false;
        }
        return cmp;
      };
      // Below the file's precision the inputs are rounded to the compute dtype first, which moves the
      // exact result by itself: the FP64 reference on the rounded inputs measures how far, and a
      // check's error may exceed its threshold by that much (input_rounding_rel_rms).
      TensorMap rounded_outs, rounded_grads;
      const bool rounded = !reference && dt != at::kDouble;
      if (rounded) {
        TensorMap xr = prepare(g.inputs, u, dt, at::Device(at::kCPU), true);
        TensorMap cr;
        for (const auto& [n, t] : g.cotangents) cr.set(n, t.to(dt).to(at::kDouble));
        std::tie(rounded_outs, rounded_grads) = forward_backward(u, xr, cr, Backend::Reference, true);
      }
      // A whole model below fp64 also runs the FP64 reference's code in the compute dtype on the CPU
      // (the baseline, as the model conformance cases: conformance_checks.h): a check passes by its
      // threshold or by an error at most kBaselineFactor times the baseline's.
      TensorMap base_outs, base_grads;
      const bool with_baseline = rounded && uses_baseline(dtype, g.level);
      if (with_baseline) {
        TensorMap xb = prepare(g.inputs, u, dt, at::Device(at::kCPU), false);
        TensorMap cb;
        for (const auto& [n, t] : g.cotangents) cb.set(n, t.to(dt));
        std::tie(base_outs, base_grads) = forward_backward(u, xb, cb, Backend::Reference, true);
      }
      Json checks = Json::array();
      bool ok = true;
      auto check = [&](const std::string& n, const char* kind, const at::Tensor& want, const at::Tensor& got,
                       const TensorMap& base) {
        const bool gradient = std::string(kind) == "gradient";
        const Comparison cmp = measure(want, got, gradient);
        double t = thr(gradient ? TensorKind::Gradient : TensorKind::Output);
        double base_err = 0;
        if (rounded && base.has(n)) {
          base_err = measure(want, base.at(n), gradient).rel_rms;
          if (std::isfinite(base_err)) t += base_err;
        }
        Json c;
        if (with_baseline) {
          const TensorMap& bm = gradient ? base_grads : base_outs;
          c = baseline_check_json(n, kind, cmp, t,
                                  bm.has(n) ? measure(want, bm.at(n), gradient) : Comparison{INFINITY, INFINITY, false, false});
        } else {
          c = check_json(n, kind, cmp, t);
        }
        if (rounded) c["input_rounding_rel_rms"] = std::isfinite(base_err) ? Json(base_err) : Json();
        ok = ok && c["status"] == "pass";
        checks.push_back(c);
      };
      for (const auto& [n, want] : g.expected) {
        if (!outs.has(n)) throw std::runtime_error("the path did not return " + n);
        check(n, "output", want, outs.at(n), rounded_outs);
      }
      for (const auto& [n, want] : g.gradients) {
        if (!grads.has(n)) throw golden_file_error(path, fmt::format("'{}' given but that input has no gradient here", n));
        check(n, "gradient", want, grads.at(n), rounded_grads);
      }
      return {{"status", ok ? "pass" : "fail"}, {"checks", checks}};
    }));
  }
  return results;
}

}  // namespace mixbench
