#include "mixers/loop/lt2_stream.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "harness/backbone.h"
#include "harness/errors.h"

namespace mixbench {
namespace {

// ρ ⊙ h, Backend::Reference: an explicit loop over channels in double, independent of the fast
// path's broadcast multiply.
at::Tensor rho_times_reference(const at::Tensor& rho, const at::Tensor& h) {
  const int64_t d = h.size(-1);
  if (rho.numel() != d) throw std::logic_error("lt2: ρ has the wrong width");
  const at::Tensor hd = h.to(at::kDouble), rd = rho.to(at::kDouble);
  std::vector<at::Tensor> channels;
  channels.reserve(size_t(d));
  for (int64_t c = 0; c < d; ++c) channels.push_back(rd[c] * hd.select(-1, c));
  return at::stack(channels, -1).to(h.scalar_type());
}

class Lt2Stream final : public ResidualStream {
 public:
  Lt2Stream(int64_t blocks, int64_t loops) : blocks_(blocks), loops_(loops), inner_(nanochat_stream()) {}
  std::string name() const override { return "lt2"; }
  // nanochat's stream plus the cross-loop term: the same work at every position
  bool static_decode() const override { return true; }

  std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const override {
    if (plan.n_steps() != blocks_ * loops_)
      throw std::logic_error(fmt::format("lt2 stream: a plan of {} steps for {} blocks × {} loops", plan.n_steps(), blocks_, loops_));
    std::vector<ParamDef> p = inner_->params(d, plan);
    // zero-initialised per-channel gates, trained with AdamW like the mixers' non-matrix parameters
    if (loops_ > 1)
      p.push_back({"lt2_rho", {loops_ - 1, d.d_model}, ParamGroup::Scalar, false, "const", 0.0, 0,
                   adamw_rule("lt2_rho", 0.02, 0.8, 0.95, 0.0, false, true)});
    return p;
  }

  TensorMap begin(const at::Tensor& x, const TensorMap& P, Backend b) const override {
    TensorMap st = inner_->begin(x, P, b);
    st.set("lt2_prev", x);  // h⁽⁰⁾: the (smeared, normalized) embedding
    return st;
  }

  at::Tensor read(TensorMap& st, const Sublayer& s, const TensorMap& P) const override { return inner_->read(st, s, P); }

  void write(TensorMap& st, const Sublayer& s, const at::Tensor& y, const TensorMap& P) const override {
    const bool loop_end = s.kind == Sublayer::Kind::Mlp && (s.step + 1) % blocks_ == 0;
    const int64_t tau = (s.step + 1) / blocks_;  // 1-based loop that ends here
    if (!loop_end || tau < 2) {
      inner_->write(st, s, y, P);
      if (loop_end) st.set("lt2_prev", st.at("x"));
      return;
    }
    // h⁽τ⁾ = h̃⁽τ⁾ + ρ_τ ⊙ h⁽τ⁻¹⁾: the cross-loop term joins the last sublayer's output, so the
    // inner stream's backout (when it is kept here) sees h⁽τ⁾
    const at::Tensor rho = P.at("lt2_rho")[tau - 2];
    const at::Tensor& prev = st.at("lt2_prev");
    const at::Tensor cross = s.backend == Backend::Reference ? rho_times_reference(rho, prev) : rho * prev;
    inner_->write(st, s, y + cross, P);
    st.set("lt2_prev", st.at("x"));
  }

  at::Tensor finish(TensorMap& st, const TensorMap& P, Backend b) const override { return inner_->finish(st, P, b); }

  // ρ_τ ⊙ h and the add: 2·d per token per loop boundary
  double fwd_flops(const ModelDims& d, const ExecPlan&) const override { return 2.0 * double(d.d_model) * double(loops_ - 1); }

 private:
  int64_t blocks_, loops_;
  std::shared_ptr<const ResidualStream> inner_;
};

}  // namespace

std::shared_ptr<const ResidualStream> lt2_stream(int64_t blocks, int64_t loops) {
  if (blocks < 1 || loops < 1)
    throw InputError(fmt::format("lt2: {} blocks × {} loops (both must be at least 1)", blocks, loops));
  return std::make_shared<Lt2Stream>(blocks, loops);
}

}  // namespace mixbench
