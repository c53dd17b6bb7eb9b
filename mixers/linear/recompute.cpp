#include "mixers/linear/recompute.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace mixbench::linear {

std::vector<at::Tensor> recompute_backward(torch::autograd::AutogradContext* ctx, const std::vector<at::Tensor>& grads,
                                           size_t n_args, const ChunkedFn& chunked) {
  auto saved = ctx->get_saved_variables();
  at::AutoGradMode enable(true);
  std::vector<at::Tensor> in(saved.size()), xs;
  std::vector<size_t> which;
  for (size_t i = 0; i < saved.size(); ++i) {
    if (!present(saved[i]).defined()) continue;
    in[i] = saved[i].detach();
    if (ctx->needs_input_grad(i)) {
      in[i].requires_grad_(true);
      xs.push_back(in[i]);
      which.push_back(i);
    }
  }
  std::vector<at::Tensor> out(n_args);
  if (xs.empty()) return out;
  auto [o, ht] = chunked(in);
  std::vector<at::Tensor> outs, gs;
  if (grads.size() > 0 && grads[0].defined()) outs.push_back(o), gs.push_back(grads[0]);
  if (grads.size() > 1 && grads[1].defined()) outs.push_back(ht), gs.push_back(grads[1]);
  if (outs.empty()) return out;
  auto gx = torch::autograd::grad(outs, xs, gs, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t n = 0; n < which.size(); ++n) out[which[n]] = gx[n];
  return out;
}

namespace {
// The two functions travel in the context as integers (saved_data holds IValues).
struct RawGatedFn : public torch::autograd::Function<RawGatedFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& h0, double scale, int64_t raw, int64_t chunked) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["chunked"] = chunked;
    ctx->save_for_backward({q, k, v, g, h0});
    auto [o, ht] = reinterpret_cast<GatedFwd>(raw)(q, k, v, g, scale, present(h0));
    return {o, ht};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto chunked = reinterpret_cast<GatedFwd>(ctx->saved_data["chunked"].toInt());
    return recompute_backward(ctx, grads, 8, [scale, chunked](const std::vector<at::Tensor>& in) {
      return chunked(in[0], in[1], in[2], in[3], scale, in[4]);
    });
  }
};
}  // namespace

std::pair<at::Tensor, at::Tensor> raw_forward_chunked_backward(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, const at::Tensor& g, double scale,
                                                               const at::Tensor& h0, GatedFwd raw, GatedFwd chunked) {
  if (!grad_needed({&q, &k, &v, &g, &h0})) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return raw(q, k, v, g, scale, h0);
  }
  // The autograd function takes defined tensors only: an absent h0 travels as an empty tensor.
  auto r = RawGatedFn::apply(q, k, v, g, h0.defined() ? h0 : at::empty({0}, q.options()), scale,
                             reinterpret_cast<int64_t>(raw), reinterpret_cast<int64_t>(chunked));
  return {r[0], r[1]};
}

bool grad_needed(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

}  // namespace mixbench::linear
