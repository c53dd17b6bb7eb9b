#include "suites/golden.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <type_traits>
#include <variant>
#include <vector>

#include "harness/errors.h"
#include "suites/unit_golden.h"

namespace mixbench {

SafetensorsFile make_golden(const GoldenRequest& req) {
  const OpSpec& spec = Registry::get().op(req.op);
  Config cfg = spec.params.parse(req.config);
  const int64_t B = req.batch, T = req.seq_len;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(req.seed);
  TensorMap in = spec.make_inputs(cfg, B, T, gen);
  std::vector<at::Tensor> diff;
  std::vector<std::string> names;
  for (const auto& [n, t] : in) {
    bool d = at::isFloatingType(t.scalar_type());
    for (const auto& def : spec.inputs)
      if (def.name == n) d = d && def.differentiable;
    if (d) {
      t.requires_grad_(true);
      diff.push_back(t);
      names.push_back(n);
    }
  }
  TensorMap outs = spec.reference(in, cfg);
  SafetensorsFile golden;
  TensorMap& file = golden.tensors;
  for (const auto& [n, t] : in) file.set(n, t.detach());
  at::Tensor loss;
  for (const auto& [n, o] : outs) {
    file.set(n, o.detach());
    if (!at::isFloatingType(o.scalar_type())) continue;
    at::Tensor d = at::randn(o.sizes(), gen, o.options().requires_grad(false));
    file.set("d" + n, d);
    loss = loss.defined() ? loss + (o * d).sum() : (o * d).sum();
  }
  if (loss.defined() && !diff.empty()) {
    auto g = torch::autograd::grad({loss}, diff, {}, false, false, true);
    for (size_t i = 0; i < g.size(); ++i) file.set("grad_" + names[i], g[i].defined() ? g[i] : at::zeros_like(diff[i]));
  }
  std::map<std::string, std::string>& meta = golden.metadata;
  meta = config_metadata(spec.params, cfg);
  meta["op"] = spec.name;
  if (cfg.f("scale") == 0.0 && spec.params.find("scale") && in.has("q"))
    meta["scale"] = fmt::format("{:.17g}", 1.0 / std::sqrt(double(in.at("q").size(-1))));
  return golden;
}

size_t write_golden(const GoldenRequest& req, const std::string& path) {
  const SafetensorsFile golden = make_golden(req);
  write_safetensors(path, golden.tensors, golden.metadata);
  return golden.tensors.size();
}

InputError golden_file_error(const std::string& path, const std::string& why) {
  return InputError(fmt::format("golden file '{}': {}", path, why));
}

GoldenFile read_golden(const std::string& path) {
  GoldenFile g;
  g.file = read_safetensors(path);  // InputError on a malformed file
  const SafetensorsFile& f = g.file;
  auto fail = [&](const std::string& why) { return golden_file_error(path, why); };
  if (!f.metadata.count("op")) throw fail("metadata has no 'op'");
  const OpSpec& spec = Registry::get().op(f.metadata.at("op"));
  g.op = &spec;
  std::string overrides;
  for (const auto& [k, v] : f.metadata) {
    if (k == "op" || !spec.params.find(k)) continue;
    overrides += (overrides.empty() ? "" : ",") + k + "=" + v;
  }
  try {
    g.config = spec.params.parse(overrides);
  } catch (const InputError& e) {
    throw fail(e.what());
  }
  for (const auto& d : spec.inputs) {
    if (f.tensors.has(d.name)) {
      at::Tensor t = f.tensors.at(d.name);
      g.inputs.set(d.name, at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t.to(at::kLong));
    } else if (!d.optional) {
      throw fail(fmt::format("missing input tensor '{}'", d.name));
    }
  }
  try {
    if (spec.check_inputs) spec.check_inputs(g.inputs, g.config);
  } catch (const InputError& e) {
    throw fail(e.what());
  }
  for (const auto& o : spec.outputs)
    if (f.tensors.has("d" + o)) g.cotangents.set(o, f.tensors.at("d" + o).to(at::kDouble));
  for (const auto& [n, t] : f.tensors)
    if (t.scalar_type() == at::kFloat) g.dtype = "fp32";
  return g;
}

}  // namespace mixbench
