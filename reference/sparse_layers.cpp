// FP64 references for block-sparse attention and the sparse-attention layers (MoBA, DSA): plain
// loops over tokens; selections are made on detached FP64 values with explicit sorts.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "reference/reference.h"
#include "reference/sparse.h"

namespace mixbench::reference {

namespace {

at::Tensor project(const at::Tensor& x, const at::Tensor& w) { return (x.unsqueeze(-2) * w).sum(-1); }

// Softmax over the allowed entries of logits [H,S] (mask [H,S] bool, every row has one), then
// Σ_s p·v with v [S,H,Dv] -> [H,Dv]; also returns p.
std::pair<at::Tensor, at::Tensor> masked_attend(const at::Tensor& logits, const at::Tensor& mask, const at::Tensor& v) {
  at::Tensor l = logits.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor m = std::get<0>(l.max(1, true)).detach();
  at::Tensor e = (l - m).exp();
  at::Tensor p = e / e.sum(1, true);
  return {(p.transpose(0, 1).unsqueeze(-1) * v).sum(0), p};
}

// NeoX (half-split) rotation by +θ on the first R dims of x [..,T,..,D] along dim 1 positions.
at::Tensor rope_neox_partial(const at::Tensor& x, int64_t R, double base) {
  const int64_t T = x.size(1), half = R / 2;
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor xt = x.select(1, t);
    std::vector<double> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t) * std::pow(base, -double(2 * i) / double(R));
      c[size_t(i)] = std::cos(a);
      s[size_t(i)] = std::sin(a);
    }
    at::Tensor cs = from_doubles(c, x.options().requires_grad(false)), sn = from_doubles(s, x.options().requires_grad(false));
    at::Tensor x1 = xt.narrow(-1, 0, half), x2 = xt.narrow(-1, half, half), rest = xt.narrow(-1, R, xt.size(-1) - R);
    rows.push_back(at::cat({x1 * cs - x2 * sn, x2 * cs + x1 * sn, rest}, -1));
  }
  return at::stack(rows, 1);
}

}  // namespace

at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& block_indices, int64_t block_size, int64_t q_block,
                                  double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Hkv = k.size(2), G = H / Hkv, Dv = v.size(3);
  const int64_t nb = block_indices.size(3);
  at::Tensor idx = block_indices.to(at::kCPU, at::kLong).contiguous();
  auto acc = idx.accessor<int64_t, 4>();
  std::vector<at::Tensor> out_b;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> out_t;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = t / q_block;
      std::vector<at::Tensor> heads;
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t i = acc[b][hk][r][j];
          if (i < 0) continue;
          for (int64_t s = i * block_size; s < std::min((i + 1) * block_size, T); ++s)
            if (s <= t) keys.push_back(s);
        }
        if (keys.empty()) {
          heads.push_back(at::zeros({G, Dv}, v.options().requires_grad(false)) + 0.0 * v.sum());
          continue;
        }
        at::Tensor sel = at::tensor(keys, at::TensorOptions().dtype(at::kLong));
        at::Tensor ks = k.select(0, b).select(1, hk).index_select(0, sel);  // [S,D]
        at::Tensor vs = v.select(0, b).select(1, hk).index_select(0, sel);  // [S,Dv]
        at::Tensor qs = q.select(0, b).select(0, t).narrow(0, hk * G, G);   // [G,D]
        at::Tensor logits = (qs.unsqueeze(1) * ks.unsqueeze(0)).sum(-1) * scale;  // [G,S]
        at::Tensor m = std::get<0>(logits.max(1, true)).detach();
        at::Tensor e = (logits - m).exp();
        at::Tensor p = e / e.sum(1, true);
        heads.push_back((p.unsqueeze(-1) * vs.unsqueeze(0)).sum(1));  // [G,Dv]
      }
      out_t.push_back(at::cat(heads, 0));
    }
    out_b.push_back(at::stack(out_t, 0));
  }
  return at::stack(out_b, 0);
}

at::Tensor moba_layer(const at::Tensor& x, const at::Tensor& ve, const SparseLayerWeights& w, int64_t n_head,
                      int64_t n_kv_head, int64_t head_dim, double rope_base, int64_t block, int64_t topk_blocks,
                      LayerSelection* sel) {
  const int64_t B = x.size(0), T = x.size(1), H = n_head, G = n_head / n_kv_head;
  NanochatQKV qkv = nanochat_qkv(x, ve, {w.c_q, w.c_k, w.c_v, w.c_proj, w.ve_gate}, n_head, n_kv_head, head_dim, rope_base);
  at::Tensor ke = qkv.k.repeat_interleave(G, 2), vv = qkv.v.repeat_interleave(G, 2);  // [B,T,H,dh]
  const double scale = 1.0 / std::sqrt(double(head_dim));
  const int64_t NB = (T + block - 1) / block;
  // Gate inputs, detached (the selection carries no gradient).
  at::Tensor qd = qkv.q.detach().contiguous(), kd = ke.detach();
  std::vector<at::Tensor> kbar;  // [H,dh] per block: mean of the keys the block holds
  for (int64_t bi = 0; bi < NB; ++bi) kbar.push_back(kd.narrow(1, bi * block, std::min(block, T - bi * block)).mean(1));
  at::Tensor kb = at::stack(kbar, 1).contiguous();  // [B,NB,H,dh]
  const int64_t K = std::min(topk_blocks, NB);
  const double inf = std::numeric_limits<double>::infinity();
  // Selection [B,H,T,K] (own block first, −1 padded) and candidate scores [B,H,T,NB], row-major.
  std::vector<int64_t> chosen(size_t(B * H * T * K), -1);
  std::vector<double> scores(size_t(B * H * T * NB), -inf);
  at::Tensor forced;
  if (sel && sel->forced.defined()) forced = sel->forced.to(at::kCPU, at::kLong).contiguous();
  std::vector<at::Tensor> out_b;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> out_t;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cur = t / block;
      at::Tensor gate = (qd[b][t].unsqueeze(0) * kb[b].narrow(0, 0, cur + 1)).sum(-1).to(at::kDouble).contiguous();  // [cur+1,H]
      auto g = gate.accessor<double, 2>();
      at::Tensor mask = at::zeros({H, t + 1}, at::TensorOptions().dtype(at::kBool));
      for (int64_t h = 0; h < H; ++h) {
        const size_t row = size_t(((b * H + h) * T + t));
        std::vector<std::pair<double, int64_t>> sc;
        for (int64_t i = 0; i <= cur; ++i) sc.emplace_back(i == cur ? inf : g[i][h], i);
        for (const auto& [v, i] : sc) scores[row * size_t(NB) + size_t(i)] = v;
        std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
        std::vector<int64_t> blocks;
        if (forced.defined()) {
          for (int64_t j = 0; j < forced.size(3); ++j)
            if (forced[b][h][t][j].item<int64_t>() >= 0) blocks.push_back(forced[b][h][t][j].item<int64_t>());
        } else {
          for (int64_t j = 0; j < std::min<int64_t>(topk_blocks, int64_t(sc.size())); ++j) blocks.push_back(sc[size_t(j)].second);
        }
        for (size_t j = 0; j < blocks.size() && int64_t(j) < K; ++j) chosen[row * size_t(K) + j] = blocks[j];
        for (int64_t i : blocks)
          mask[h].narrow(0, i * block, std::min(block, t + 1 - i * block)).fill_(true);
      }
      at::Tensor ks = ke[b].narrow(0, 0, t + 1), vs = vv[b].narrow(0, 0, t + 1);  // [t+1,H,dh]
      at::Tensor logits = (qkv.q[b][t].unsqueeze(0) * ks).sum(-1).transpose(0, 1) * scale;  // [H,t+1]
      out_t.push_back(masked_attend(logits, mask, vs).first);
    }
    out_b.push_back(at::stack(out_t, 0));
  }
  at::Tensor y = at::stack(out_b, 0);  // [B,T,H,dh]
  if (sel) {
    sel->chosen = forced.defined() ? forced : at::tensor(chosen, at::TensorOptions().dtype(at::kLong)).view({B, H, T, K});
    sel->scores = at::tensor(scores, at::TensorOptions().dtype(at::kDouble)).view({B, H, T, NB});
  }
  return project(y.reshape({B, T, H * head_dim}), w.c_proj);
}

DsaOut dsa_layer(const at::Tensor& x, const at::Tensor& ve, const SparseLayerWeights& w, int64_t n_head,
                 int64_t n_kv_head, int64_t head_dim, double rope_base, int64_t idx_heads, int64_t idx_dim,
                 int64_t idx_rope_dim, int64_t topk, LayerSelection* sel) {
  const int64_t B = x.size(0), T = x.size(1), H = n_head, G = n_head / n_kv_head;
  const double scale = 1.0 / std::sqrt(double(head_dim));
  NanochatQKV qkv = nanochat_qkv(x, ve, {w.c_q, w.c_k, w.c_v, w.c_proj, w.ve_gate}, n_head, n_kv_head, head_dim, rope_base);
  // Indexer on the detached input: q^I, LayerNorm'd k^I (eps 1e-6, biased variance), partial NeoX
  // RoPE on the first idx_rope_dim dims, signed head weights scaled by H_I^-½·d_I^-½.
  at::Tensor xd = x.detach();
  at::Tensor qi = project(xd, w.idx_wq).view({B, T, idx_heads, idx_dim});
  at::Tensor kr = project(xd, w.idx_wk);  // [B,T,DI]
  at::Tensor mu = kr.mean(-1, true), var = (kr - mu).pow(2).mean(-1, true);
  at::Tensor ki = (kr - mu) / (var + 1e-6).sqrt() * w.idx_kn_w + w.idx_kn_b;
  qi = rope_neox_partial(qi, idx_rope_dim, rope_base);
  ki = rope_neox_partial(ki.unsqueeze(2), idx_rope_dim, rope_base).squeeze(2);
  at::Tensor wi = project(xd, w.idx_w) * (1.0 / std::sqrt(double(idx_heads))) * (1.0 / std::sqrt(double(idx_dim)));
  const int64_t K = std::min(topk, T);
  at::Tensor indices = sel && sel->forced.defined() ? sel->forced.to(at::kCPU, at::kLong).contiguous()
                                                    : dsa_indexer(qi, ki, wi, K, 1.0, true);  // [B,T,K]
  if (sel) {
    // The indexer's scores I[t,s] = Σ_j w[t,j]·ReLU(q^I_{t,j}·k^I_s) of the visible keys s ≤ t.
    c10::NoGradGuard ng;
    at::Tensor sim = at::matmul(qi.detach(), ki.detach().unsqueeze(1).transpose(-1, -2)).clamp_min(0.0);  // [B,T,HI,T]
    at::Tensor I = (sim * wi.detach().unsqueeze(-1)).sum(2);                                              // [B,T,T]
    const at::Tensor future = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
    sel->chosen = indices;
    sel->scores = I.masked_fill(future, -std::numeric_limits<double>::infinity()).contiguous();
  }
  at::Tensor o = sparse_attention(qkv.q, qkv.k, qkv.v, indices, scale);
  at::Tensor y = project(o.reshape({B, T, H * head_dim}), w.c_proj);
  // Auxiliary KL over the selected set.
  auto acc = indices.accessor<int64_t, 3>();
  at::Tensor qd = qkv.q.detach(), kd = qkv.k.detach().repeat_interleave(G, 2);
  at::Tensor total = at::zeros({}, x.options().requires_grad(false));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> sel;
      for (int64_t j = 0; j < K; ++j)
        if (acc[b][t][j] >= 0) sel.push_back(acc[b][t][j]);
      at::Tensor si = at::tensor(sel, at::TensorOptions().dtype(at::kLong));
      at::Tensor logits = (qd[b][t].unsqueeze(0) * kd[b].index_select(0, si)).sum(-1) * scale;  // [S,H]
      at::Tensor pm = at::softmax(logits, 0).sum(1);
      at::Tensor p = pm / pm.sum();                                                        // [S]
      at::Tensor sim = (qi[b][t].unsqueeze(0) * ki[b].index_select(0, si).unsqueeze(1)).sum(-1);  // [S,HI]
      at::Tensor I = (sim.clamp_min(0.0) * wi[b][t].unsqueeze(0)).sum(-1);                 // [S]
      at::Tensor mI = std::get<0>(I.max(0, true)).detach();
      at::Tensor logq = I - mI - (I - mI).exp().sum().log();
      total = total + (p * (p.log() - logq)).sum();
    }
  }
  return {y, total / double(B * T)};
}

}  // namespace mixbench::reference
