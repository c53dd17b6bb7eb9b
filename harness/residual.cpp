#include "harness/residual.h"

#include <ATen/ATen.h>

#include "harness/backbone.h"

namespace mixbench {
namespace {

class NanochatStream final : public ResidualStream {
 public:
  std::string name() const override { return "nanochat"; }

  std::vector<ParamDef> params(const ModelDims&, const ExecPlan& plan) const override {
    const int64_t n = plan.n_steps();
    return {
        {"backout_lambda", {1}, ParamGroup::Scalar, false, "const", 0.2, 0},
        {"resid_lambdas", {n}, ParamGroup::Scalar, false, "resid_lambdas", 0, 0},
        {"x0_lambdas", {n}, ParamGroup::Scalar, false, "x0_lambdas", 0, 0},
    };
  }

  TensorMap begin(const at::Tensor& x, const TensorMap&) const override { return TensorMap{{"x", x}, {"x0", x}}; }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.kind == Sublayer::Kind::Mixer)
      st.set("x", P.at("resid_lambdas")[s.step] * st.at("x") + P.at("x0_lambdas")[s.step] * st.at("x0"));
    return st.at("x");
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap&) const override {
    st.set("x", st.at("x") + y);
    if (s.kind == Sublayer::Kind::Mlp && s.step == s.n_steps / 2) st.set("backout", st.at("x"));
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P) const override {
    if (!st.has("backout")) return st.at("x");
    return st.at("x") - P.at("backout_lambda") * st.at("backout");
  }
};

}  // namespace

std::shared_ptr<const ResidualStream> nanochat_stream() {
  static const std::shared_ptr<const ResidualStream> s = std::make_shared<NanochatStream>();
  return s;
}

}  // namespace mixbench
