// FP64 per-token recurrences of delta_rule, gated_delta_rule and kda (fla/ops/*/naive.py).
#include <ATen/ATen.h>

#include "reference/delta.h"

namespace mixbench::reference {

std::pair<at::Tensor, at::Tensor> delta_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& beta, const at::Tensor& g, double scale,
                                                  const at::Tensor& h0) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  at::Tensor S = h0.defined() ? h0 : at::zeros({B, H, K, V}, v.options().requires_grad(false));
  std::vector<at::Tensor> outs;
  outs.reserve(size_t(T));
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor qt = q.select(1, t) * scale;  // [B,H,K]
    at::Tensor kt = k.select(1, t);          // [B,H,K]
    at::Tensor vt = v.select(1, t);          // [B,H,V]
    at::Tensor bt = beta.select(1, t);       // [B,H]
    if (g.defined()) {
      at::Tensor gt = g.select(1, t).exp();  // [B,H] or [B,H,K]
      S = g.dim() == 3 ? S * gt.view({B, H, 1, 1}) : S * gt.unsqueeze(-1);
    }
    at::Tensor pred = (S * kt.unsqueeze(-1)).sum(2);          // Sᵀk  [B,H,V]
    at::Tensor vnew = bt.unsqueeze(-1) * (vt - pred);         // v'
    S = S + kt.unsqueeze(-1) * vnew.unsqueeze(-2);            // S + k v'ᵀ
    outs.push_back((S * qt.unsqueeze(-1)).sum(2));            // Sᵀ(scale q)
  }
  return {at::stack(outs, 1), S};
}

}  // namespace mixbench::reference
