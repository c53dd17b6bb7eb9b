// FP64 references for token-sparse attention and the DSA lightning indexer.
#include "reference/sparse.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace mixbench::reference {

at::Tensor sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& indices, double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Hkv = k.size(2), K = indices.size(2);
  const int64_t G = H / Hkv, Dv = v.size(3);
  at::Tensor idx = indices.to(at::kCPU, at::kLong).contiguous();
  auto acc = idx.accessor<int64_t, 3>();
  std::vector<at::Tensor> rows_b;
  for (int64_t b = 0; b < B; ++b) {
    at::Tensor kb = k.select(0, b).repeat_interleave(G, 1);  // [T,H,D]
    at::Tensor vb = v.select(0, b).repeat_interleave(G, 1);  // [T,H,Dv]
    std::vector<at::Tensor> rows_t;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> sel;
      for (int64_t j = 0; j < K; ++j)
        if (acc[b][t][j] >= 0) sel.push_back(acc[b][t][j]);
      if (sel.empty()) {
        rows_t.push_back(at::zeros({H, Dv}, v.options().requires_grad(false)) + 0.0 * v.sum());
        continue;
      }
      at::Tensor s_idx = at::tensor(sel, at::TensorOptions().dtype(at::kLong));
      at::Tensor ks = kb.index_select(0, s_idx);                   // [S,H,D]
      at::Tensor vs = vb.index_select(0, s_idx);                   // [S,H,Dv]
      at::Tensor qt = q.select(0, b).select(0, t);                 // [H,D]
      at::Tensor logits = (qt.unsqueeze(0) * ks).sum(-1) * scale;  // [S,H]
      at::Tensor m = std::get<0>(logits.max(0, true));
      at::Tensor p = (logits - m.detach()).exp();
      p = p / p.sum(0, true);
      rows_t.push_back((p.unsqueeze(-1) * vs).sum(0));  // [H,Dv]
    }
    rows_b.push_back(at::stack(rows_t, 0));
  }
  return at::stack(rows_b, 0);
}

at::Tensor dsa_indexer(const at::Tensor& q_idx, const at::Tensor& k_idx, const at::Tensor& w_idx, int64_t topk,
                       double scale, bool relu) {
  const int64_t B = q_idx.size(0), T = q_idx.size(1), HI = q_idx.size(2);
  at::Tensor out = at::full({B, T, topk}, -1, at::TensorOptions().dtype(at::kLong));
  auto acc = out.accessor<int64_t, 3>();
  at::Tensor qd = q_idx.detach().to(at::kCPU, at::kDouble);
  at::Tensor kd = k_idx.detach().to(at::kCPU, at::kDouble);
  at::Tensor wd = w_idx.defined() ? w_idx.detach().to(at::kCPU, at::kDouble) : at::Tensor();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      at::Tensor qt = qd[b][t];                                                     // [HI,DI]
      at::Tensor ks = kd[b].slice(0, 0, t + 1);                                     // [S,DI], s ≤ t
      at::Tensor sim = (ks.unsqueeze(1) * qt.unsqueeze(0)).sum(-1) * scale;         // [S,HI]
      if (relu) sim = sim.clamp_min(0.0);
      at::Tensor w = wd.defined() ? wd[b][t] : at::ones({HI}, sim.options());       // [HI]
      at::Tensor score = (sim * w.unsqueeze(0)).sum(-1).to(at::kDouble).contiguous();  // [S]
      const double* sp = score.data_ptr<double>();
      std::vector<std::pair<double, int64_t>> scored;
      for (int64_t s = 0; s <= t; ++s) scored.emplace_back(sp[s], s);
      // Descending score; stable, so among equal scores the lower key index comes first.
      std::stable_sort(scored.begin(), scored.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      const int64_t S = std::min<int64_t>(topk, int64_t(scored.size()));
      for (int64_t j = 0; j < S; ++j) acc[b][t][j] = scored[size_t(j)].second;
    }
  }
  return out.to(q_idx.device());
}

}  // namespace mixbench::reference
