#include "mixers/common/qkv_op.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "harness/errors.h"

namespace mixbench::qkv_op {

double resolve_scale(const Config& p, int64_t D) {
  double s = p.f("scale");
  return s > 0 ? s : 1.0 / std::sqrt(double(D));
}

ConfigSpec params(const std::string& op, const std::function<void(ConfigSpec&)>& own) {
  ConfigSpec s;
  s.f("scale", 0.0, "softmax scale; 0 = D^-0.5", 0.0);
  if (own) own(s);
  s.i("H", 4, "query heads (case shape)", 1)
      .i("Hkv", 4, "KV heads (case shape)", 1)
      .i("D", 16, "q/k head dim (case shape)", 1)
      .i("Dv", 0, "v head dim (case shape); 0 = D", 0)
      .rule([op](const Config& c) {
        if (c.i("H") % c.i("Hkv") != 0)
          throw InputError(fmt::format("{}: H={} is not divisible by Hkv={}", op, c.i("H"), c.i("Hkv")));
      });
  return s;
}

void check_inputs(const std::string& op, const TensorMap& in, const std::vector<std::string>& extra) {
  std::vector<std::string> names = {"q", "k", "v"};
  names.insert(names.end(), extra.begin(), extra.end());
  for (const std::string& n : names)
    if (!in.has(n)) throw InputError(fmt::format("{}: missing input '{}'", op, n));
  for (const char* n : {"q", "k", "v"})
    if (in.at(n).dim() != 4)
      throw InputError(fmt::format("{}: '{}' must be [B,T,H,D], got {} dims", op, n, in.at(n).dim()));
  const auto &q = in.at("q"), &k = in.at("k"), &v = in.at("v");
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || k.size(1) != q.size(1) || v.size(1) != q.size(1))
    throw InputError(fmt::format("{}: q, k, v must share batch and length", op));
  if (k.size(2) != v.size(2)) throw InputError(fmt::format("{}: k and v must have the same number of heads", op));
  if (k.size(2) == 0 || q.size(2) % k.size(2) != 0)
    throw InputError(fmt::format("{}: {} query heads are not a multiple of {} KV heads", op, q.size(2), k.size(2)));
  if (k.size(3) != q.size(3)) throw InputError(fmt::format("{}: q and k head dims differ", op));
}

TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t H = c.i("H"), Hkv = c.i("Hkv"), D = c.i("D"), Dv = c.i("Dv") > 0 ? c.i("Dv") : c.i("D");
  return {{"q", at::randn({B, T, H, D}, gen, o)},
          {"k", at::randn({B, T, Hkv, D}, gen, o)},
          {"v", at::randn({B, T, Hkv, Dv}, gen, o)}};
}

OpSpec spec(const std::string& name, const std::string& family, const std::string& summary,
            const std::string& citation, const ConfigSpec& params, std::vector<TensorDef> extra_inputs,
            std::function<void(const TensorMap&, const Config&)> check) {
  OpSpec s;
  s.name = name;
  s.family = family;
  s.summary = summary;
  s.citation = citation;
  s.params = params;
  s.inputs = {{"q"}, {"k"}, {"v"}};
  s.inputs.insert(s.inputs.end(), extra_inputs.begin(), extra_inputs.end());
  s.outputs = {"o"};
  s.check_inputs = std::move(check);
  return s;
}

}  // namespace mixbench::qkv_op
