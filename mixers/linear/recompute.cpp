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

bool grad_needed(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

}  // namespace mixbench::linear
