#include "suites/conformance_subject.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness/decode_graph.h"
#include "harness/errors.h"
#include "harness/method_selection.h"
#include "harness/metrics.h"
#include "harness/nvtx.h"

namespace mixbench::conformance_detail {

namespace {

// The fields every row of case c starts from (a subject adds its own: layer, layer_mixers).
Json case_base(const Json& method, const Json& op, const char* level, const CaseDef& c, const ConformanceOptions& opt,
               Json shape, uint64_t seed) {
  Json base = {{"method", method}, {"op", op}, {"level", level}, {"case", c.label},
               {"device", opt.backend == Backend::CUDA ? "cuda" : "cpu"}, {"dtype", opt.dtype},
               {"backend", backend_name(opt.backend)}, {"shape", std::move(shape)}, {"config", c.cfg.to_json()}};
  base["seed"] = seed;
  return base;
}

// A subject whose case c draws from a generator seeded by (name, c.label); fill does the rest.
Subject seeded_subject(std::vector<CaseDef> cases, const std::string& name, const ConformanceOptions& opt,
                       std::function<void(const CaseDef&, at::Generator&, SubjectCase&)> fill) {
  Subject s;
  s.cases = std::move(cases);
  s.make = [name, &opt, fill](const CaseDef& c) {
    SubjectCase k;
    k.seed = case_seed(opt.seed, name, c.label);
    at::Generator gen = make_gen(k.seed);
    fill(c, gen, k);
    return k;
  };
  return s;
}

// The check of a decode path's outputs against the forward's when the path could not run (a capture
// failure): a failed check with the reason.
Json failed_check(const std::string& tensor, double thr, const std::string& why) {
  return {{"tensor", tensor}, {"kind", "invariant"}, {"rel_rms", nullptr}, {"max_abs", nullptr},
          {"threshold", thr},  {"status", "fail"},    {"message", why}};
}

// An invariant after the case; its row's case label is the case's plus suffix.
FollowUp invariant(std::string suffix, std::function<Json()> run) {
  FollowUp f;
  f.kind = FollowUp::Invariant;
  f.case_suffix = std::move(suffix);
  f.run = std::move(run);
  return f;
}

// Decode path of a whole model: model_prefill(T−n) then n model_decode_step calls against
// model_forward(T), n = min(4, T−1). Checks "prefill_logits" (the prefill's last-position logits)
// and "decode_logits" (each decoded token's logits) at the dtype's layer threshold.
Json run_model_decode_case(const Model& proto, const TensorMap& inputs64, const ConformanceOptions& opt) {
  c10::NoGradGuard ng;
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const at::Device dev = device_of(opt.backend);
  Model mm = proto;
  mm.params = TensorMap();
  for (const auto& [n, t] : inputs64)
    if (n != "idx") mm.params.set(n, t.to(dt).to(dev));
  const at::Tensor idx = inputs64.at("idx").to(dev);
  const int64_t T = idx.size(1), n = std::min<int64_t>(4, T - 1), Tp = T - n;
  at::Tensor full = model_forward(mm, idx, opt.backend);
  ModelCache cache;
  at::Tensor pre = model_prefill(mm, idx.slice(1, 0, Tp), opt.backend, &cache);
  std::vector<at::Tensor> steps;
  for (int64_t t = Tp; t < T; ++t) steps.push_back(model_decode_step(mm, idx.slice(1, t, t + 1), cache, opt.backend));
  const double thr = check_threshold(opt.dtype, TensorKind::Output, "model");
  Json checks = Json::array();
  bool ok = cache.pos == T;
  Json c1 = check_json("prefill_logits", "invariant", compare(full.slice(1, Tp - 1, Tp), pre), thr);
  Json c2 = check_json("decode_logits", "invariant", compare(full.slice(1, Tp), at::cat(steps, 1)), thr);
  for (const Json& c : {c1, c2}) {
    ok = ok && c["status"] == "pass";
    checks.push_back(c);
  }
  // On a GPU a model with static caches also decodes as the sweeps do, its whole step captured in a
  // CUDA graph (DecodeGraph, static caches of capacity T): "decode_logits_graph" = the first step
  // (the graph's eager warm-up) and n − 1 replays, each fed the forward's next token.
  if (opt.backend == Backend::CUDA && n >= 2 && model_has_static_decode(mm)) {
    Json c3;
    try {
      ModelCache sc;
      model_prefill(mm, idx.slice(1, 0, Tp), opt.backend, &sc, T);
      DecodeGraph g(mm, sc, idx.slice(1, Tp, Tp + 1));
      std::vector<at::Tensor> gsteps = {g.logits().clone()};
      for (int64_t t = Tp + 1; t < T; ++t) {
        g.input().copy_(idx.slice(1, t, t + 1));
        g.step();
        gsteps.push_back(g.logits().clone());
      }
      c3 = check_json("decode_logits_graph", "invariant", compare(full.slice(1, Tp), at::cat(gsteps, 1)), thr);
    } catch (const std::exception& e) {
      c3 = failed_check("decode_logits_graph", thr, e.what());
    }
    ok = ok && c3["status"] == "pass";
    checks.push_back(c3);
  }
  Json r = {{"status", ok ? "pass" : "fail"}, {"checks", checks}};
  r["shape"]["decode_steps"] = n;
  r["shape"]["prefill_T"] = Tp;
  if (cache.pos != T) r["message"] = fmt::format("cache position {} after {} tokens", cache.pos, T);
  return r;
}

// Decode path of a layer: prefill(T−n) then n decode steps against forward(T), n = min(4, T−1).
// Checks: "prefill_y" (prefill's y == forward's first T−n positions) and "decode_y" (the decoded
// tokens == forward's last n positions), rel-RMS at the dtype's layer threshold.
Json run_decode_case(const MethodSpec& m, const Config& cfg, const LayerCtx& ctx, const TensorMap& inputs64,
                     const ConformanceOptions& opt) {
  c10::NoGradGuard ng;
  const at::ScalarType dt = parse_dtype(opt.dtype);
  const at::Device dev = opt.backend == Backend::CUDA ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  TensorMap in;
  for (const auto& [n, t] : inputs64) in.set(n, floating(t) ? t.to(dt).to(dev) : t.to(dev));
  const at::Tensor x = in.at("x");
  const int64_t T = x.size(1), n = std::min<int64_t>(4, T - 1), Tp = T - n;
  ScopedMethod sm(m.name);
  at::Tensor full = m.forward(in, cfg, ctx, opt.backend).at("y");
  auto slice_in = [&](int64_t a, int64_t b) {
    TensorMap s2 = in;
    s2.set("x", x.slice(1, a, b));
    if (in.has("ve")) s2.set("ve", in.at("ve").slice(1, a, b));
    return s2;
  };
  TensorMap cache;
  at::Tensor pre = m.prefill(slice_in(0, Tp), cache, cfg, ctx, opt.backend).at("y");
  std::vector<at::Tensor> steps;
  for (int64_t t = Tp; t < T; ++t) steps.push_back(m.decode(slice_in(t, t + 1), cache, cfg, ctx, opt.backend).at("y"));
  const double thr = threshold(opt.dtype, TensorKind::Output, /*layer=*/true);
  Json checks = Json::array();
  bool ok = cache_pos(cache) == T;
  Json c1 = check_json("prefill_y", "invariant", compare(full.slice(1, 0, Tp), pre), thr);
  Json c2 = check_json("decode_y", "invariant", compare(full.slice(1, Tp), at::cat(steps, 1)), thr);
  for (const Json& c : {c1, c2}) {
    ok = ok && c["status"] == "pass";
    checks.push_back(c);
  }
  // On a GPU a method with static caches also decodes with its step captured in a CUDA graph, as the
  // sweeps do: "decode_y_graph" = prefill into buffers of capacity T, the first step eager (the
  // warm-up), then n − 1 replays of one capture that reads x (and ve) from fixed buffers and advances
  // the device position.
  if (opt.backend == Backend::CUDA && n >= 2 && m.static_decode) {
    Json c3;
    try {
      TensorMap sc;
      sc.set("pos_dev", at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(dev)));
      sc.set("capacity", at::scalar_tensor(T, at::TensorOptions().dtype(at::kLong)));
      m.prefill(slice_in(0, Tp), sc, cfg, ctx, opt.backend);
      sc.at("pos_dev").fill_(Tp);
      TensorMap step_in = slice_in(Tp, Tp + 1);
      for (const char* name : {"x", "ve"})
        if (step_in.has(name)) step_in.set(name, step_in.at(name).clone());
      at::Tensor y;
      auto step = [&] {
        y = m.decode(step_in, sc, cfg, ctx, opt.backend).at("y");
        sc.at("pos_dev").add_(1);
      };
      CapturedWork w(-1);
      w.run(step);
      std::vector<at::Tensor> gsteps = {y.clone()};
      w.capture(step);
      for (int64_t t = Tp + 1; t < T; ++t) {
        for (const char* name : {"x", "ve"})
          if (step_in.has(name)) step_in.at(name).copy_(in.at(name).slice(1, t, t + 1));
        w.replay();
        gsteps.push_back(y.clone());
      }
      c3 = check_json("decode_y_graph", "invariant", compare(full.slice(1, Tp), at::cat(gsteps, 1)), thr);
    } catch (const std::exception& e) {
      c3 = failed_check("decode_y_graph", thr, e.what());
    }
    ok = ok && c3["status"] == "pass";
    checks.push_back(c3);
  }
  Json r = {{"status", ok ? "pass" : "fail"}, {"checks", checks}};
  r["shape"]["decode_steps"] = n;
  r["shape"]["prefill_T"] = Tp;
  if (cache_pos(cache) != T) r["message"] = fmt::format("cache position {} after {} tokens", cache_pos(cache), T);
  return r;
}

}  // namespace

Unit op_unit(const OpSpec& spec, const Config& cfg) {
  Unit u;
  u.method = "op";
  u.name = spec.name;
  u.level = "op";
  u.reference = [&spec, cfg](const TensorMap& in) { return spec.reference(in, cfg); };
  u.optimized = [&spec, cfg](const TensorMap& in, Backend b) {
    switch (b) {
      case Backend::CPU: return spec.cpu(in, cfg);
      case Backend::CUDA:
        if (!spec.cuda) throw UsageError(fmt::format("op '{}' has no CUDA path", spec.name));
        return spec.cuda(in, cfg);
      default: return spec.reference(in, cfg);
    }
  };
  for (const auto& d : spec.inputs)
    if (!d.differentiable) u.nondiff.insert(d.name);
  u.selection = spec.selection_outputs;
  if (spec.selection_scores) u.selection_scores = [&spec, cfg](const TensorMap& in) { return spec.selection_scores(in, cfg); };
  return u;
}

Unit layer_unit(const MethodSpec& m, const Config& cfg, const LayerCtx& ctx) {
  Unit u;
  u.method = m.name;
  u.name = "layer";
  u.level = "layer";
  u.reference = [&m, cfg, ctx](const TensorMap& in) { return m.reference(in, cfg, ctx); };
  u.optimized = [&m, cfg, ctx](const TensorMap& in, Backend b) {
    ScopedMethod sm(m.name);
    return m.forward(in, cfg, ctx, b);
  };
  if (const MethodSelection* s = method_selection(m.name)) {
    u.selection = s->outputs;
    u.reference_takes_selection = true;
    if (s->scores) u.selection_scores = [s, cfg, ctx](const TensorMap& in) { return s->scores(in, cfg, ctx); };
  }
  return u;
}

// A whole model (hybrids, which have no layer of their own): inputs are the model's parameters
// by name plus "idx" [B,T] token ids; outputs "logits" (and "aux_loss" when a layer returns one).
// The reference runs every layer's FP64 reference around the backbone (model_forward with
// Backend::Reference), the optimized path every layer's forward on the requested backend.
Unit model_unit(const MethodSpec& m, const Model& proto) {
  Unit u;
  u.method = m.name;
  u.name = "model";
  u.level = "model";
  auto run = [proto](const TensorMap& in, Backend b) {
    Model mm = proto;
    mm.params = TensorMap();
    for (const auto& [n, t] : in)
      if (n != "idx") mm.params.set(n, t);
    ModelAux aux;
    TensorMap out{{"logits", model_forward(mm, in.at("idx"), b, &aux)}};
    if (aux.aux_loss.defined()) out.set("aux_loss", aux.aux_loss);
    if (aux.exit_logits.defined()) {  // several exits: every exit's logits and the exit distribution
      out.set("exit_logits", aux.exit_logits);
      out.set("exit_probs", aux.exits.probs);
    }
    return out;
  };
  u.reference = [run](const TensorMap& in) { return run(in, Backend::Reference); };
  u.optimized = [run](const TensorMap& in, Backend b) { return run(in, b); };
  u.nondiff.insert("idx");
  return u;
}

Subject op_subject(const OpSpec& spec, const ConformanceOptions& opt) {
  return seeded_subject(spec.cases(), spec.name, opt, [&spec, &opt](const CaseDef& c, at::Generator& gen, SubjectCase& k) {
    k.unit = op_unit(spec, c.cfg);
    TensorMap in = spec.make_inputs(c.cfg, c.B, c.T, gen);
    for (const auto& d : c.drop) in.erase(d);
    k.inputs = in;
    k.base = case_base(nullptr, spec.name, "op", c, opt, shape_json(c.B, c.T, in), k.seed);
    if (opt.backend == Backend::CUDA && !spec.cuda) k.skip_reason = "no CUDA path registered";
    k.nvtx = nvtx_name({"op", spec.name, "case_" + c.label});
    if (spec.invariants) {
      // chunked == recurrent, prefill + decode == longer prefill, split with state == one pass
      k.follow_ups.push_back(invariant("", [&spec, &opt, in, cfg = c.cfg]() -> Json {
        const double thr = threshold(opt.dtype, TensorKind::Output);
        Json checks = Json::array();
        bool ok = true;
        for (const auto& [name, err] : spec.invariants(in, cfg, opt.backend, parse_dtype(opt.dtype))) {
          bool pass = std::isfinite(err) && err <= thr;
          ok = ok && pass;
          checks.push_back({{"tensor", name}, {"kind", "invariant"}, {"rel_rms", std::isfinite(err) ? Json(err) : Json()},
                            {"max_abs", nullptr}, {"threshold", thr}, {"finite", std::isfinite(err)},
                            {"status", pass ? "pass" : "fail"}});
        }
        return {{"status", ok ? "pass" : "fail"}, {"checks", checks}};
      }));
    }
    if (c.T <= 40) k.follow_ups.push_back(FollowUp{});
  });
}

Subject layer_subject(const MethodSpec& m, const ConformanceOptions& opt) {
  return seeded_subject(m.cases(), m.name, opt, [&m, &opt](const CaseDef& c, at::Generator& gen, SubjectCase& k) {
    LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
    k.unit = layer_unit(m, c.cfg, ctx);
    TensorMap in = m.make_inputs(c.cfg, ctx, c.B, c.T, gen);
    for (const auto& def : m.params(c.cfg, ctx)) in.set(def.name, random_param(def, gen, at::TensorOptions().dtype(at::kDouble)));
    k.inputs = in;
    k.base = case_base(m.name, nullptr, "layer", c, opt, shape_json(c.B, c.T, in), k.seed);
    k.base["layer"] = c.layer;
    if (opt.backend == Backend::CUDA && !m.has_cuda) k.skip_reason = "no CUDA path registered";
    k.nvtx = nvtx_name({m.name, "layer", "case_" + c.label});
    if (c.T <= 40) k.follow_ups.push_back(FollowUp{});
    if (m.has_decode() && c.T >= 2)  // prefill + decode steps == forward (the method's incremental decoding path)
      k.follow_ups.push_back(
          invariant("/decode", [&m, &opt, cfg = c.cfg, ctx, in] { return run_decode_case(m, cfg, ctx, in, opt); }));
  });
}

Subject model_subject(const MethodSpec& m, const ConformanceOptions& opt) {
  return seeded_subject(m.cases(), m.name, opt, [&m, &opt](const CaseDef& c, at::Generator& gen, SubjectCase& k) {
    Model proto = build_model(m, c.cfg, gen, at::TensorOptions().dtype(at::kDouble), /*random_nonzero=*/true);
    TensorMap in;
    in.set("idx", at::randint(proto.dims.vocab, {c.B, c.T}, gen, at::TensorOptions().dtype(at::kLong)));
    for (const auto& [n, t] : proto.params) in.set(n, t);
    k.inputs = in;
    k.unit = model_unit(m, proto);
    k.base = case_base(m.name, nullptr, "model", c, opt, {{"B", c.B}, {"T", c.T}, {"n_layer", proto.dims.n_layer}},
                       k.seed);
    k.base["layer_mixers"] = proto.layer_mixers;
    if (opt.backend == Backend::CUDA && !m.has_cuda)
      k.skip_reason = "a layer method has no CUDA path";
    else if (m.is_hybrid() && (opt.dtype == "bf16" || opt.dtype == "fp16"))
      k.skip_reason = fmt::format("a hybrid is checked as a whole model at fp64 and fp32; in {} its layer methods are checked at layer level", opt.dtype);
    k.nvtx = nvtx_name({m.name, "model", "case_" + c.label});
    // finite differences along random directions for every parameter: short cases only
    if (c.T <= 24) k.follow_ups.push_back(FollowUp{});
    if (model_has_decode(proto) && c.T >= 2)
      k.follow_ups.push_back(invariant("/decode", [proto, in, &opt] { return run_model_decode_case(proto, in, opt); }));
  });
}

std::vector<Subject> conformance_subjects(const ConformanceOptions& opt) {
  Registry& reg = Registry::get();
  std::vector<Subject> out;
  for (const auto& op_name : opt.ops) out.push_back(op_subject(reg.op(op_name), opt));
  // A hybrid has no layer of its own and a method with its own plan or residual stream has no
  // layer check that covers it: both are checked as whole small models, against the model
  // thresholds or the baseline (check_threshold, uses_baseline) — a single method at every dtype, a
  // hybrid at fp64 and fp32 (in half precision several hybrids' whole-model gradients land 3–8×
  // the baseline's error on the CPU, for reasons not established, so their layers are checked at
  // layer level instead). Below fp64 the layer methods are checked at layer level too.
  std::vector<std::string> methods = opt.methods;
  if (opt.dtype != "fp64")
    for (const auto& m_name : opt.methods) {
      const MethodSpec& m = reg.method(m_name);
      if (!m.model_level()) continue;
      for (const CaseDef& c : m.cases())
        for (const auto& l : layer_methods(m, c.cfg))
          if (std::find(methods.begin(), methods.end(), l.method->name) == methods.end()) methods.push_back(l.method->name);
    }
  for (const auto& m_name : methods) {
    const MethodSpec& m = reg.method(m_name);
    out.push_back(m.model_level() ? model_subject(m, opt) : layer_subject(m, opt));
  }
  return out;
}

}  // namespace mixbench::conformance_detail
