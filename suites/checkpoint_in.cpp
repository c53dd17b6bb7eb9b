#include "suites/checkpoint_in.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include "harness/errors.h"
#include "harness/foreign_names.h"

namespace mixbench {

std::string model_state_scheme(const SafetensorsFile& f) {
  return f.tensors.has("transformer.wte.weight") ? "nanochat" : "mixbench";
}

std::string nanochat_config_overrides(const std::map<std::string, std::string>& meta, const std::string& where) {
  auto num = [&](const std::string& k) -> int64_t {
    const std::string& v = meta.at(k);
    try {
      size_t used = 0;
      const int64_t n = std::stoll(v, &used);
      if (used == v.size() && n > 0) return n;
    } catch (const std::logic_error&) {
    }
    throw InputError(fmt::format("{}: metadata '{}' = '{}' is not a positive integer", where, k, v));
  };
  std::string out;
  auto add = [&](const std::string& kv) { out += (out.empty() ? "" : ",") + kv; };
  if (meta.count("n_layer")) add(fmt::format("n_layer={}", num("n_layer")));
  if (meta.count("n_embd")) add(fmt::format("d_model={}", num("n_embd")));
  if (meta.count("n_embd") && meta.count("n_head")) {
    const int64_t d = num("n_embd"), h = num("n_head");
    if (d % h != 0) throw InputError(fmt::format("{}: n_embd {} is not divisible by n_head {}", where, d, h));
    add(fmt::format("head_dim={}", d / h));
    if (meta.count("n_kv_head")) {
      const int64_t kv = num("n_kv_head");
      if (h % kv != 0) throw InputError(fmt::format("{}: n_head {} is not divisible by n_kv_head {}", where, h, kv));
      add(fmt::format("kv_ratio={}", h / kv));
    }
  }
  if (meta.count("sequence_len")) add(fmt::format("seq_len={}", num("sequence_len")));
  if (meta.count("vocab_size")) add(fmt::format("vocab={}", num("vocab_size")));
  if (meta.count("window_pattern")) add("window_pattern=" + meta.at("window_pattern"));
  return out;
}

namespace {
void assign(Model& model, const TensorMap& loaded) {
  c10::NoGradGuard ng;
  for (const auto& [n, t] : loaded) {
    const at::Tensor& p = model.params.at(n);
    at::Tensor v = t.to(p.options().dtype(p.scalar_type()));
    if (p.requires_grad()) p.copy_(v);
    else model.params.set(n, v.clone());
  }
}
}  // namespace

void load_model_state(const SafetensorsFile& f, const std::string& path, Model& model) {
  const std::string where = fmt::format("checkpoint '{}'", path);
  const std::string scheme = model_state_scheme(f);
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& [n, t] : model.params) expected.emplace_back(n, t.sizes().vec());
  TensorMap theirs;
  bool train_ckpt = false;
  for (const auto& [n, t] : f.tensors)
    if (n.rfind("param.", 0) == 0) train_ckpt = true;
  for (const auto& [n, t] : f.tensors) {
    if (train_ckpt && n.rfind("param.", 0) != 0) continue;  // a training checkpoint's optimizer state
    if (!at::isFloatingType(t.scalar_type()))
      throw InputError(fmt::format("{}: tensor '{}' is not floating point", where, n));
    theirs.set(train_ckpt ? n.substr(6) : n, t);
  }
  ParamAliases aliases;
  if (scheme == "nanochat") {
    try {
      aliases = model_aliases(*model.method, model.cfg, "nanochat");
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("{} holds nanochat's names: {}", where, e.what()));
    }
  }
  assign(model, from_foreign(theirs, aliases, expected, scheme == "nanochat" ? "nanochat" : "", where));
}

void load_layer_state(const SafetensorsFile& f, const std::string& path, Model& model, std::vector<int64_t> layers,
                      const std::string& scheme_in) {
  const std::string where = fmt::format("layer checkpoint '{}'", path);
  const int64_t L = model.dims.n_layer;
  if (layers.empty())
    for (int64_t i = 0; i < L; ++i) layers.push_back(i);
  std::string scheme = scheme_in;
  if (scheme.empty()) {  // the names the file uses
    const MethodSpec& m = *model.layer_specs.at(0);
    for (const std::string& s : foreign_schemes()) {
      if (!m.foreign_names.count(s)) continue;
      for (const auto& a : m.foreign_names.at(s)(model.layer_cfgs.at(0)).aliases)
        if (f.tensors.has(a.theirs)) scheme = s;
      if (!scheme.empty()) break;
    }
    if (scheme.empty())
      throw InputError(fmt::format("{}: none of its tensors is a parameter name of method {}'s layer in a scheme it "
                                   "has (nanochat, fla)", where, m.name));
  }
  for (int64_t i : layers) {
    if (i < 0 || i >= L) throw UsageError(fmt::format("layer {} is outside the model's {} layers", i, L));
    const MethodSpec& m = *model.layer_specs.at(size_t(i));
    const Config& cfg = model.layer_cfgs.at(size_t(i));
    const LayerCtx ctx{i, L};
    const ParamAliases aliases = layer_aliases(m, cfg, ctx, scheme);
    std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
    for (const auto& d : m.params(cfg, ctx))
      if (alias_of_ours(aliases, d.name)) expected.emplace_back(d.name, d.shape);
    TensorMap loaded = from_foreign(f.tensors, aliases, expected, scheme, where);
    TensorMap prefixed;
    for (const auto& [n, t] : loaded) prefixed.set(fmt::format("layers.{}.mixer.{}", i, n), t);
    assign(model, prefixed);
  }
}

}  // namespace mixbench
