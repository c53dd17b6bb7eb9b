#include "harness/residual.h"

#include <ATen/ATen.h>

#include "harness/backbone.h"
#include "harness/fused_ops.h"

#include <stdexcept>

namespace mixbench {
namespace {

class NanochatStream final : public ResidualStream {
 public:
  explicit NanochatStream(int64_t backout_step) : backout_step_(backout_step) {}
  std::string name() const override { return "nanochat"; }
  bool static_decode() const override { return true; }

  std::vector<ParamDef> params(const ModelDims&, const ExecPlan& plan) const override {
    const int64_t n = plan.n_steps();
    // nanochat's AdamW groups (the backout scale trains with the smear parameters)
    return {
        {"backout_lambda", {1}, ParamGroup::Scalar, false, "const", 0.2, 0,
         adamw_rule("smear", 0.2, 0.8, 0.95, 0.0, false, false)},
        {"resid_lambdas", {n}, ParamGroup::Scalar, false, "ramp", 1.15, -0.10,
         adamw_rule("resid_lambdas", 0.005, 0.8, 0.95, 0.05, false, true)},
        {"x0_lambdas", {n}, ParamGroup::Scalar, false, "ramp", 0.20, -0.15,
         adamw_rule("x0_lambdas", 0.5, 0.96, 0.95, 0.0, false, true)},
    };
  }

  TensorMap begin(const at::Tensor& x, const TensorMap&, Backend) const override { return TensorMap{{"x", x}, {"x0", x}}; }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    if (s.kind == Sublayer::Kind::Mixer)
      st.set("x", scaled_sum(P.at("resid_lambdas")[s.step], st.at("x"), P.at("x0_lambdas")[s.step], st.at("x0")));
    return st.at("x");
  }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap&) const override {
    st.set("x", st.at("x") + y);
    const int64_t keep = backout_step_ < 0 ? s.n_steps / 2 : backout_step_;
    if (s.kind == Sublayer::Kind::Mlp && s.step == keep) st.set("backout", st.at("x"));
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend) const override {
    if (!st.has("backout")) return st.at("x");
    return st.at("x") - P.at("backout_lambda") * st.at("backout");
  }

 private:
  int64_t backout_step_;  // < 0: the unrolled midpoint n_steps / 2
};

}  // namespace

ResidualStream::ExitLoss ResidualStream::exit_loss(const Exits&, const at::Tensor&, const at::Tensor&, bool,
                                                   Backend) const {
  throw std::logic_error("residual stream " + name() + " has one exit: it has no exit loss");
}

std::shared_ptr<const ResidualStream> nanochat_stream() {
  static const std::shared_ptr<const ResidualStream> s = std::make_shared<NanochatStream>(-1);
  return s;
}

std::shared_ptr<const ResidualStream> nanochat_stream(int64_t backout_step) {
  if (backout_step < 0) return nanochat_stream();
  return std::make_shared<NanochatStream>(backout_step);
}

}  // namespace mixbench
