#include "suites/model_golden.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/safetensors.h"

namespace mixbench {
namespace {

using Json = nlohmann::json;
constexpr const char* kFormat = "mixbench-model-golden-1";

const at::TensorOptions kF64 = at::TensorOptions().dtype(at::kDouble);

std::string join_lengths() {
  std::string s;
  for (int64_t T : model_golden_lengths()) s += (s.empty() ? "" : ",") + std::to_string(T);
  return s;
}

// Forward and gradients of one model on one input: logits of both paths, the aux loss and every
// parameter's gradient of Σ logits·dlogits + aux_loss (optimized CPU path).
struct Run {
  at::Tensor logits, ref_logits, aux_loss;
  TensorMap grads;
};

Run run_model_golden(const Model& proto, const TensorMap& params, const at::Tensor& idx, const at::Tensor& dlogits) {
  Run r;
  Model m = proto;
  m.params = TensorMap();
  for (const auto& [n, t] : params) m.params.set(n, t.detach().clone().requires_grad_(true));
  {
    ModelAux aux;
    at::Tensor logits = model_forward(m, idx, Backend::CPU, &aux);
    at::Tensor L = (logits * dlogits).sum();
    if (aux.aux_loss.defined()) {
      L = L + aux.aux_loss.to(L.scalar_type());
      r.aux_loss = aux.aux_loss.detach().reshape({1}).to(at::kDouble);
    }
    L.backward();
    r.logits = logits.detach();
    for (const auto& [n, t] : m.params)
      r.grads.set(n, t.grad().defined() ? t.grad().detach().clone() : at::zeros_like(t.detach()));
  }
  {
    c10::NoGradGuard ng;
    r.ref_logits = model_forward(m, idx, Backend::Reference).detach();
  }
  return r;
}

// RMS(expected − got) over the larger of RMS(expected) and `floor`.
double rel_rms(const at::Tensor& expected, const at::Tensor& got, double floor = 0.0) {
  at::Tensor e = expected.to(at::kDouble), g = got.to(at::kDouble);
  if (e.sizes() != g.sizes()) return INFINITY;
  if (e.numel() == 0) return 0;
  const double num = (e - g).pow(2).mean().sqrt().item<double>();
  const double den = e.pow(2).mean().sqrt().item<double>();
  if (!std::isfinite(num)) return INFINITY;
  return num / (std::max(den, floor) + 1e-300);
}

}  // namespace

const std::vector<int64_t>& model_golden_lengths() {
  static const std::vector<int64_t> L = {1, 17, 64};
  return L;
}

Config model_golden_config(const MethodSpec& m) {
  std::vector<CaseDef> cases = m.cases();
  if (cases.empty()) throw std::logic_error("method " + m.name + " has no cases");
  const Config base = cases.front().cfg;
  // Shrink step by step; the first set the method's rules accept wins.
  const std::string layers = m.is_hybrid() ? "" : "n_layer=2,";
  const std::vector<std::string> tries = {
      layers + "d_model=32,head_dim=16,vocab=32,mlp_hidden=32,seq_len=64",
      layers + "vocab=32,mlp_hidden=32,seq_len=64",
      layers + "vocab=32,seq_len=64",
      "seq_len=64",
  };
  for (const auto& t : tries) {
    try {
      return m.config.parse(t, &base);
    } catch (const InputError&) {
    }
  }
  return base;
}

void write_model_golden(const MethodSpec& m, const std::string& dir) {
  const Config cfg = model_golden_config(m);
  const uint64_t seed = std::stoull(fnv1a_hex("model-golden/" + m.name), nullptr, 16) & 0xffffffffffffULL;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Model proto = build_model(m, cfg, gen, kF64, /*random_nonzero=*/true);
  TensorMap out;
  TensorMap params;
  for (const auto& [n, t] : proto.params) {
    at::Tensor p32 = t.to(at::kFloat);
    out.set("param." + n, p32);
    params.set(n, p32.to(at::kDouble));
  }
  for (int64_t T : model_golden_lengths()) {
    at::Tensor idx = at::randint(proto.dims.vocab, {1, T}, gen, at::TensorOptions().dtype(at::kLong));
    at::Tensor dl = at::randn({1, T, proto.dims.vocab}, gen, kF64).to(at::kFloat);
    Run r = run_model_golden(proto, params, idx, dl.to(at::kDouble));
    const std::string s = fmt::format("T{}", T);
    out.set("idx." + s, idx);
    out.set("dlogits." + s, dl);
    out.set("logits." + s, r.logits);
    out.set("ref_logits." + s, r.ref_logits);
    if (r.aux_loss.defined()) out.set("aux_loss." + s, r.aux_loss);
    for (const auto& [n, g] : r.grads) out.set(fmt::format("grad.{}.{}", s, n), g);
  }
  std::filesystem::create_directories(dir);
  write_safetensors((std::filesystem::path(dir) / (m.name + ".safetensors")).string(), out,
                    {{"format", kFormat}, {"method", m.name}, {"config", cfg.str()}, {"lengths", join_lengths()},
                     {"seed", std::to_string(seed)}});
}

std::vector<GoldenDiff> check_model_golden(const std::string& path, double tol) {
  SafetensorsFile f = read_safetensors(path);
  auto meta = [&](const std::string& k) -> const std::string& {
    auto it = f.metadata.find(k);
    if (it == f.metadata.end()) throw InputError(fmt::format("{}: model golden lacks metadata '{}'", path, k));
    return it->second;
  };
  if (meta("format") != kFormat)
    throw InputError(fmt::format("{}: format '{}' is not {}", path, meta("format"), kFormat));
  const MethodSpec& m = Registry::get().method(meta("method"));
  const Config cfg = m.config.parse(meta("config"), nullptr);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  Model proto = build_model(m, cfg, gen, kF64, /*random_nonzero=*/true);

  std::vector<GoldenDiff> diffs;
  TensorMap params;
  for (const auto& [n, t] : proto.params) {
    if (!f.tensors.has("param." + n)) {
      diffs.push_back({"param." + n + " (missing from the file)", INFINITY, false});
      continue;
    }
    at::Tensor p = f.tensors.at("param." + n).to(at::kDouble);
    if (p.sizes() != t.sizes()) {
      diffs.push_back({"param." + n + " (shape differs from the model's)", INFINITY, false});
      continue;
    }
    params.set(n, p);
  }
  for (const auto& [n, t] : f.tensors)
    if (n.rfind("param.", 0) == 0 && !proto.params.has(n.substr(6)))
      diffs.push_back({n + " (the model has no such parameter)", INFINITY, false});
  if (!diffs.empty()) return diffs;

  std::string lengths = meta("lengths");
  size_t pos = 0;
  while (pos < lengths.size()) {
    size_t e = lengths.find(',', pos);
    if (e == std::string::npos) e = lengths.size();
    const int64_t T = std::stoll(lengths.substr(pos, e - pos));
    pos = e + 1;
    const std::string s = fmt::format("T{}", T);
    Run r = run_model_golden(proto, params, f.tensors.at("idx." + s), f.tensors.at("dlogits." + s).to(at::kDouble));
    auto cmp = [&](const std::string& name, const at::Tensor& got) {
      const double rel = rel_rms(f.tensors.at(name), got);
      diffs.push_back({name, rel, rel <= tol});
    };
    cmp("logits." + s, r.logits);
    cmp("ref_logits." + s, r.ref_logits);
    if (f.tensors.has("aux_loss." + s) || r.aux_loss.defined()) {
      if (!f.tensors.has("aux_loss." + s) || !r.aux_loss.defined())
        diffs.push_back({"aux_loss." + s + " (present on one side only)", INFINITY, false});
      else
        cmp("aux_loss." + s, r.aux_loss);
    }
    // A gradient is compared relative to the larger of its own RMS and the RMS of all the model's
    // gradients at this length: some are rounding noise in FP64 (the query and key maps at T = 1,
    // zero in exact arithmetic; a backout gain's cancelling sum ~1e-8 of the others), which another
    // CPU's BLAS rounds differently, while a change of the model moves them far above 1e-12 of
    // that scale.
    double sq = 0, count = 0;
    for (const auto& [n, g] : r.grads) {
      const std::string name = fmt::format("grad.{}.{}", s, n);
      if (!f.tensors.has(name)) continue;
      sq += f.tensors.at(name).to(at::kDouble).pow(2).sum().item<double>();
      count += double(f.tensors.at(name).numel());
    }
    const double scale = count > 0 ? std::sqrt(sq / count) : 0.0;
    for (const auto& [n, g] : r.grads) {
      const std::string name = fmt::format("grad.{}.{}", s, n);
      if (!f.tensors.has(name)) {
        diffs.push_back({name + " (missing from the file)", INFINITY, false});
        continue;
      }
      const double rel = rel_rms(f.tensors.at(name), g, scale);
      diffs.push_back({name, rel, rel <= tol});
    }
  }
  return diffs;
}

namespace {
Json cost_json(const ModelCost& c) {
  const ParamCount& p = c.params;
  Json j = {{"wte", p.wte},
            {"value_embeds", p.value_embeds},
            {"lm_head", p.lm_head},
            {"transformer_matrices", p.transformer_matrices},
            {"scalars", p.scalars},
            {"matmul", p.matmul},
            {"train_flops_nanochat", c.train_flops_nanochat},
            {"fwd_flops", c.fwd_flops},
            {"uncounted_flops", c.uncounted_flops},
            {"decode_flops", c.decode_flops},
            {"act_bytes", c.act_bytes},
            {"cache_bytes_per_token", c.cache_bytes_per_token},
            {"state_bytes", c.state_bytes}};
  if (c.aux_route_fwd_flops != 0) {  // plans with auxiliary routes only (the others' numbers stay as they were)
    j["aux_route_fwd_flops"] = c.aux_route_fwd_flops;
    j["aux_route_uncounted_flops"] = c.aux_route_uncounted_flops;
  }
  return j;
}
}  // namespace

Json account_golden() {
  Json out = Json::object();
  for (const MethodSpec* m : Registry::get().methods()) {
    const Config small = model_golden_config(*m);
    const Config def = m->config.defaults();
    CostQuery qs;
    qs.T = 64;
    qs.context = 64;
    CostQuery qd;
    qd.T = def.i("seq_len");
    qd.context = qd.T;
    out[m->name] = {{"golden_config", cost_json(account_model(*m, small, qs))},
                    {"default_config", cost_json(account_model(*m, def, qd))}};
  }
  return out;
}

std::vector<GoldenDiff> check_account_golden(const Json& stored, double tol) {
  std::vector<GoldenDiff> diffs;
  const Json now = account_golden();
  for (auto it = stored.begin(); it != stored.end(); ++it)
    if (!now.contains(it.key())) diffs.push_back({it.key() + " (no longer registered)", INFINITY, false});
  for (auto it = now.begin(); it != now.end(); ++it) {
    if (!stored.contains(it.key())) {
      diffs.push_back({it.key() + " (not in the stored numbers)", INFINITY, false});
      continue;
    }
    for (const char* where : {"golden_config", "default_config"})
      for (auto f = it.value()[where].begin(); f != it.value()[where].end(); ++f) {
        const std::string name = fmt::format("{}.{}.{}", it.key(), where, f.key());
        const Json& s = stored[it.key()][where];
        if (!s.contains(f.key())) {
          diffs.push_back({name + " (missing)", INFINITY, false});
          continue;
        }
        const double a = s[f.key()].get<double>(), b = f.value().get<double>();
        const double rel = a == b ? 0.0 : std::fabs(a - b) / std::max(std::fabs(a), 1e-300);
        diffs.push_back({name, rel, rel <= tol});
      }
  }
  return diffs;
}

}  // namespace mixbench
