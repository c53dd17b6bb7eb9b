#include "harness/residual.h"

#include <ATen/ATen.h>

#include "harness/backbone.h"
#include "harness/decode_ops.h"
#include "harness/fused_stream.h"
#include "harness/fused_ops.h"

#include <stdexcept>

namespace mixbench {
namespace {

class NanochatStream final : public ResidualStream, public FusedDecodeStream {
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
    if (keeps_backout(s)) st.set("backout", st.at("x"));
  }

  // A fused decode step: the previous sublayer's output (deferred by fused_write as "y"), the
  // resid / x0 mix before a mixer and the norm in one op, the same values as write + read + norm.
  at::Tensor fused_input(TensorMap& st, const Sublayer& s, const TensorMap& P) const override {
    return modulate(st, s, fused_update(st, s, P, at::Tensor(), false, true).normed, P);
  }

  // The same update with the GEMV in its op (this stream does not modulate).
  at::Tensor fused_input_linear(TensorMap& st, const Sublayer& s, const TensorMap& P, const at::Tensor& W, bool relu_square,
                                at::Tensor* normed) const override {
    ResidualNorm rn = fused_update(st, s, P, W, relu_square, normed != nullptr);
    if (normed) *normed = rn.normed;
    return rn.out;
  }

  void fused_write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap&) const override {
    if (st.has("y")) throw std::logic_error("nanochat stream: two fused writes without an input between them");
    st.set("y", y);
    if (keeps_backout(s)) st.set("backout_pending", y);  // a marker: the sum is kept as the backout
  }

  // The last output, the backout and the final norm in one op.
  at::Tensor fused_finish(TensorMap& st, const TensorMap& P, Backend backend, at::Tensor* normed) const override {
    if (!st.has("y") || st.has("backout_pending")) {  // nothing deferred, or the backout is the sum itself (a one-step plan)
      if (st.has("y")) {
        st.set("x", st.at("x") + st.at("y"));
        st.set("backout", st.at("x"));
        st.erase("y");
        st.erase("backout_pending");
      }
      return finish(st, P, backend);
    }
    const bool backout = st.has("backout");
    ResidualNorm rn = residual_norm(st.at("x"), st.at("y"), backout ? ResidualMix::Backout : ResidualMix::None, at::Tensor(),
                                    backout ? P.at("backout_lambda") : at::Tensor(), backout ? st.at("backout") : at::Tensor());
    st.erase("y");
    st.set("x", rn.residual);
    if (normed) *normed = rn.normed;
    return rn.residual;
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend) const override {
    if (!st.has("backout")) return st.at("x");
    return st.at("x") - P.at("backout_lambda") * st.at("backout");
  }

 private:
  // whether the state after sublayer s is the one the backout subtracts
  bool keeps_backout(const Sublayer& s) const {
    const int64_t keep = backout_step_ < 0 ? s.n_steps / 2 : backout_step_;
    return s.kind == Sublayer::Kind::Mlp && s.step == keep;
  }
  // fused_input's update of the state; W defined: residual_norm_linear with it (out, and normed when
  // with_normed), else residual_norm (normed).
  ResidualNorm fused_update(TensorMap& st, const Sublayer& s, const TensorMap& P, const at::Tensor& W, bool relu_square,
                            bool with_normed) const {
    const bool mixer = s.kind == Sublayer::Kind::Mixer, keep = st.has("backout_pending");
    const at::Tensor y = st.get_or("y", at::Tensor()), a = mixer ? P.at("resid_lambdas")[s.step] : at::Tensor(),
                     b = mixer ? P.at("x0_lambdas")[s.step] : at::Tensor(), z = mixer ? st.at("x0") : at::Tensor();
    const ResidualMix mix = mixer ? ResidualMix::Scaled : ResidualMix::None;
    ResidualNorm rn = W.defined() ? residual_norm_linear(st.at("x"), y, mix, a, b, z, keep, W, relu_square, with_normed)
                                  : residual_norm(st.at("x"), y, mix, a, b, z, keep);
    if (keep) st.set("backout", rn.sum);
    st.erase("y");
    st.erase("backout_pending");
    st.set("x", rn.residual);
    return rn;
  }
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
