#include "mixers/loop/deeploop.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "harness/backbone.h"
#include "mixers/common/layers.h"
#include "mixers/loop/loop_common.h"

namespace mixbench {

double deeploop_alpha(int64_t n_unrolled) { return std::sqrt(2.0 * double(n_unrolled)); }
double deeploop_beta(int64_t n_unrolled) { return 1.0 / std::sqrt(8.0 * double(n_unrolled)); }

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class DeepLoopStream final : public ResidualStream {
 public:
  explicit DeepLoopStream(double alpha) : alpha_(alpha) {}
  std::string name() const override { return "deeploop"; }
  // the same post-norm update at every position: a decode step reads nothing from the host
  bool static_decode() const override { return true; }

  // nanochat's backout scale only (no resid/x0 mixing).
  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    std::vector<ParamDef> out;
    for (auto& p : nanochat_stream()->params(d, plan))
      if (p.name == "backout_lambda") out.push_back(p);
    return out;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap&, Backend) const override { return TensorMap{{"x", x}}; }

  at::Tensor read(TensorMap& st, const Sublayer&, const TensorMap&) const override { return st.at("x"); }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap&) const override {
    const at::Tensor& x = st.at("x");
    if (s.backend == Backend::Reference) {
      // FP64 reference: α from the unrolled depth, RMS as the root of the mean square
      const double a = std::sqrt(2.0 * double(s.n_steps));
      const at::Tensor z = x * a + y;
      const double d = double(z.size(-1));
      st.set("x", z / at::sqrt((z * z).sum(-1, /*keepdim=*/true) / d + kRmsEps));
    } else {
      const double a = alpha_ > 0 ? alpha_ : deeploop_alpha(s.n_steps);
      st.set("x", layers::rms_norm(at::add(y, x, a)));
    }
    if (s.kind == Sublayer::Kind::Mlp && s.step == s.n_steps / 2) st.set("backout", st.at("x"));
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend) const override {
    if (!st.has("backout")) return st.at("x");
    return st.at("x") - P.at("backout_lambda") * st.at("backout");
  }

  // β = 1/√(8N) as the Xavier gain of V, O and both MLP matrices; the value embeddings' range × β.
  void adjust_init(std::vector<ParamDef>& defs, const ModelDims&, const ExecPlan& plan) const override {
    const double beta = deeploop_beta(plan.n_steps());
    for (ParamDef& p : defs) {
      const bool block = p.name.rfind("layers.", 0) == 0;
      if (block && (ends_with(p.name, ".mixer.c_v") || ends_with(p.name, ".mixer.c_proj") ||
                    ends_with(p.name, ".mlp.c_fc") || ends_with(p.name, ".mlp.c_proj"))) {
        p.init = "xavier_normal";
        p.init_a = beta;
        p.init_b = 0;
      } else if (p.group == ParamGroup::ValueEmbed) {
        p.init_a *= beta;
        p.init_b *= beta;
      }
    }
  }

 private:
  double alpha_;  // 0: √(2N)
};

}  // namespace

std::shared_ptr<const ResidualStream> deeploop_stream(double alpha) {
  return std::make_shared<DeepLoopStream>(alpha);
}

MIXBENCH_REGISTER(loop_method({"deeploop", "dense",
                               "DeepLoop: the SSSL stack twice, post-norm RMSNorm(α·x + F(RMSNorm(x))), α = √(2N), "
                               "Xavier gain β = 1/√(8N) on V/O/MLP",
                               "DeepLoop v2 (70c1708) via seed 001; DeepNet arXiv 2203.00555 (α/β rule)", 2, 0, 0,
                               [](const Config&) { return deeploop_stream(); }}));

}  // namespace mixbench
