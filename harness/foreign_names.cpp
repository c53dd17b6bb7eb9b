#include "harness/foreign_names.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "harness/backbone.h"
#include "harness/errors.h"

namespace mixbench {

const std::vector<std::string>& foreign_schemes() {
  static const std::vector<std::string> s = {"nanochat", "fla"};
  return s;
}

void check_scheme(const std::string& scheme) {
  const auto& s = foreign_schemes();
  if (std::find(s.begin(), s.end(), scheme) == s.end())
    throw UsageError(fmt::format("unknown naming scheme '{}' (nanochat or fla)", scheme));
}

namespace {
std::string shape_str(at::IntArrayRef s) { return c10::str(s); }

// Negates the second half of each block of `width` rows (an involution).
at::Tensor negate_halves(const at::Tensor& t, int64_t width) {
  if (width <= 0) return t;
  if (t.dim() != 2 || t.size(0) % width != 0 || width % 2 != 0)
    throw std::logic_error("negate_second_half_rows needs a weight [heads·width, in] with an even width");
  at::Tensor v = t.reshape({t.size(0) / width, 2, width / 2, t.size(1)});
  at::Tensor sign = at::ones({1, 2, 1, 1}, t.options());
  sign[0][1] = -1;
  return (v * sign).reshape(t.sizes());
}

int64_t padded(int64_t n, int64_t to) { return to > 0 ? ((n + to - 1) / to) * to : n; }

std::vector<int64_t> their_shape(const ParamAlias& a, at::IntArrayRef ours) {
  std::vector<int64_t> s(ours.begin(), ours.end());
  switch (a.layout) {
    case ParamAlias::Layout::Reshape: s = a.their_shape; break;
    case ParamAlias::Layout::Transpose: std::reverse(s.begin(), s.end()); break;
    case ParamAlias::Layout::Same: break;
  }
  if (a.pad_rows_to > 0 && !s.empty()) s[0] = padded(s[0], a.pad_rows_to);
  return s;
}
}  // namespace

ParamAliases layer_aliases(const MethodSpec& m, const Config& cfg, const LayerCtx& ctx, const std::string& scheme) {
  check_scheme(scheme);
  auto it = m.foreign_names.find(scheme);
  if (it == m.foreign_names.end()) {
    std::string have;
    for (const auto& [k, f] : m.foreign_names) have += (have.empty() ? "" : ", ") + k;
    throw UsageError(fmt::format("method {} has no '{}' parameter names ({})", m.name, scheme,
                                 have.empty() ? "it has none" : "it has: " + have));
  }
  ParamAliases all = it->second(cfg);
  std::set<std::string> mine;
  for (const auto& d : m.params(cfg, ctx)) mine.insert(d.name);
  ParamAliases out;
  out.deviations = all.deviations;
  for (auto& a : all.aliases)
    if (mine.count(a.ours)) out.aliases.push_back(a);
  return out;
}

ParamAliases model_aliases(const MethodSpec& m, const Config& cfg, const std::string& scheme) {
  check_scheme(scheme);
  if (scheme != "nanochat")
    throw UsageError(fmt::format("the '{}' names are a single layer's: use the layer level (--level layer)", scheme));
  if (m.model_level() || !m.foreign_names.count("nanochat")) {
    std::string have;
    for (const MethodSpec* x : Registry::get().methods())
      if (!x->model_level() && x->foreign_names.count("nanochat")) have += (have.empty() ? "" : ", ") + x->name;
    throw UsageError(fmt::format("method {} has no nanochat model names (the methods that follow nanochat's "
                                 "attention on its backbone have them: {})", m.name, have));
  }
  const ModelDims d = model_dims(cfg);
  ParamAliases out;
  auto add = [&](std::string theirs, std::string ours, int64_t pad = 0, std::string note = "") {
    ParamAlias a;
    a.theirs = std::move(theirs);
    a.ours = std::move(ours);
    a.pad_rows_to = pad;
    a.note = std::move(note);
    out.aliases.push_back(std::move(a));
  };
  const std::string pad_note = "nanochat pads the vocabulary to a multiple of 64 rows";
  add("transformer.wte.weight", "wte", 64, pad_note);
  add("lm_head.weight", "lm_head", 64, pad_note);
  add("resid_lambdas", "resid_lambdas");
  add("x0_lambdas", "x0_lambdas");
  add("smear_gate.weight", "smear_gate");
  add("smear_lambda", "smear_lambda");
  add("backout_lambda", "backout_lambda");
  for (int64_t i = 0; i < d.n_layer; ++i) {
    const LayerCtx ctx{i, d.n_layer};
    if (layer_has_ve(ctx) && m.ve_dim && m.ve_dim(cfg, ctx) > 0)
      add(fmt::format("value_embeds.{}.weight", i), fmt::format("ve.{}", i), 64, pad_note);
    for (ParamAlias a : layer_aliases(m, cfg, ctx, "nanochat").aliases) {
      a.theirs = fmt::format("transformer.h.{}.attn.{}", i, a.theirs);
      a.ours = fmt::format("layers.{}.mixer.{}", i, a.ours);
      out.aliases.push_back(std::move(a));
    }
    add(fmt::format("transformer.h.{}.mlp.c_fc.weight", i), fmt::format("layers.{}.mlp.c_fc", i));
    add(fmt::format("transformer.h.{}.mlp.c_proj.weight", i), fmt::format("layers.{}.mlp.c_proj", i));
  }
  out.deviations = m.foreign_names.at("nanochat")(cfg).deviations;
  out.deviations.insert(out.deviations.begin(),
                        "nanochat's rotary tables (cos/sin buffers) are not parameters and are not in its state "
                        "dict; mixbench computes the same angles in float64");
  return out;
}

const ParamAlias* alias_of_ours(const ParamAliases& aliases, const std::string& ours) {
  for (const auto& a : aliases.aliases)
    if (a.ours == ours) return &a;
  return nullptr;
}

TensorMap to_foreign(const TensorMap& ours, const ParamAliases& aliases, const std::string& scheme) {
  TensorMap out;
  for (const auto& [n, t] : ours) {
    const ParamAlias* a = alias_of_ours(aliases, n);
    if (!a) throw UsageError(fmt::format("parameter '{}' has no name in the '{}' scheme", n, scheme));
    at::Tensor x = negate_halves(t, a->negate_second_half_rows);
    if (a->layout == ParamAlias::Layout::Transpose) x = x.t();
    if (a->layout == ParamAlias::Layout::Reshape) x = x.reshape(a->their_shape);
    if (a->pad_rows_to > 0 && x.dim() > 0 && padded(x.size(0), a->pad_rows_to) != x.size(0)) {
      std::vector<int64_t> zs(x.sizes().begin(), x.sizes().end());
      zs[0] = padded(x.size(0), a->pad_rows_to) - x.size(0);
      x = at::cat({x, at::zeros(zs, x.options())}, 0);
    }
    out.set(a->theirs, x.contiguous());
  }
  return out;
}

TensorMap from_foreign(const TensorMap& theirs, const ParamAliases& aliases,
                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
                       const std::string& scheme, const std::string& where, bool require_all) {
  std::map<std::string, const std::vector<int64_t>*> want;  // their name -> our shape
  for (const auto& [n, s] : expected) {
    const ParamAlias* a = scheme.empty() ? nullptr : alias_of_ours(aliases, n);
    if (!scheme.empty() && !a)
      throw UsageError(fmt::format("parameter '{}' has no name in the '{}' scheme", n, scheme));
    const std::string tn = a ? a->theirs : n;
    want[tn] = &s;
  }
  for (const auto& [n, t] : theirs)
    if (!want.count(n)) {
      std::vector<std::string> known;
      for (const auto& [k, v] : want) known.push_back(k);
      const auto near = closest_names(n, known, 1);
      throw InputError(fmt::format("{}: tensor '{}' is not a parameter of this model{}{}", where, n,
                                   scheme.empty() ? "" : fmt::format(" (names of the '{}' scheme)", scheme),
                                   near.empty() ? "" : fmt::format("; did you mean '{}'?", near[0])));
    }
  TensorMap out;
  for (const auto& [n, s] : expected) {
    const ParamAlias* a = scheme.empty() ? nullptr : alias_of_ours(aliases, n);
    const std::string tn = a ? a->theirs : n;
    if (!theirs.has(tn)) {
      if (!require_all) continue;
      throw InputError(fmt::format("{}: parameter tensor '{}' is missing", where, tn));
    }
    at::Tensor t = theirs.at(tn);
    std::vector<int64_t> ts = a ? their_shape(*a, s) : s;
    const bool rows_ok = a && a->pad_rows_to > 0 && t.dim() == int64_t(s.size()) && t.dim() > 0 &&
                         t.size(0) >= s[0] && t.size(0) <= ts[0] &&
                         std::equal(t.sizes().begin() + 1, t.sizes().end(), ts.begin() + 1);
    if (t.sizes().vec() != ts && !rows_ok)
      throw InputError(fmt::format("{}: tensor '{}' has shape {} but the config implies {}", where, tn,
                                   shape_str(t.sizes()), shape_str(ts)));
    if (a && a->pad_rows_to > 0 && t.dim() > 0) t = t.slice(0, 0, s[0]);
    if (a && a->layout == ParamAlias::Layout::Transpose) t = t.t();
    out.set(n, negate_halves(t.reshape(s), a ? a->negate_second_half_rows : 0).contiguous());
  }
  return out;
}

std::string describe_aliases(const ParamAliases& a) {
  std::string out;
  for (const auto& x : a.aliases) {
    std::string lay = x.layout == ParamAlias::Layout::Reshape     ? " [reshape]"
                      : x.layout == ParamAlias::Layout::Transpose ? " [transpose]"
                                                                  : "";
    if (x.pad_rows_to > 0) lay += fmt::format(" [rows padded to a multiple of {}]", x.pad_rows_to);
    if (x.negate_second_half_rows > 0)
      lay += fmt::format(" [second half of each head's {} rows negated]", x.negate_second_half_rows);
    out += fmt::format("  {:<40} <- {}{}{}\n", x.theirs, x.ours, lay, x.note.empty() ? "" : "  (" + x.note + ")");
  }
  for (const auto& d : a.deviations) out += "  deviation: " + d + "\n";
  return out;
}

}  // namespace mixbench
