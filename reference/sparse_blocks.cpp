// FP64 references for QSA, NSA and Seer (reference/sparse_blocks.h): loops over tokens (and heads),
// selections on detached FP64 values with std::stable_sort.
#include "reference/sparse_blocks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "reference/reference.h"

namespace mixbench::reference {

namespace {

at::Tensor project(const at::Tensor& x, const at::Tensor& w) { return (x.unsqueeze(-2) * w).sum(-1); }

const at::Tensor& get(const BlockLayerWeights& w, const char* name) { return w.t.at(name); }

// rope = false: the layer's q and k before their rotation (QK-normed, ×1.2).
NanochatQKV layer_qkv(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                      bool rope = true) {
  auto it = w.t.find("ve_gate");
  AttnLayerWeights aw{get(w, "c_q"), get(w, "c_k"), get(w, "c_v"), get(w, "c_proj"),
                      it == w.t.end() ? at::Tensor() : it->second};
  return nanochat_qkv(x, ve, aw, s.n_head, s.n_kv_head, s.head_dim, s.rope_base, rope);
}

// NeoX rotation by +θ at position `pos` on the first R dims of v [..., D].
at::Tensor rope_at(const at::Tensor& v, double pos, int64_t R, double base) {
  if (R == 0) return v;
  const int64_t half = R / 2;
  std::vector<double> c(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double a = pos * std::pow(base, -double(2 * i) / double(R));
    c[size_t(i)] = std::cos(a);
    sn[size_t(i)] = std::sin(a);
  }
  at::Tensor ct = from_doubles(c, v.options().requires_grad(false)), st = from_doubles(sn, v.options().requires_grad(false));
  at::Tensor x1 = v.narrow(-1, 0, half), x2 = v.narrow(-1, half, half), rest = v.narrow(-1, R, v.size(-1) - R);
  return at::cat({x1 * ct - x2 * st, x2 * ct + x1 * st, rest}, -1);
}

at::Tensor rms(const at::Tensor& x) { return x / (x.pow(2).mean(-1, true) + 1.1920928955078125e-07).sqrt(); }

// Indices of the `topk` largest scores (descending, ties to the lower index).
std::vector<int64_t> top(const std::vector<double>& score, int64_t topk) {
  std::vector<std::pair<double, int64_t>> sc;
  for (size_t i = 0; i < score.size(); ++i) sc.emplace_back(score[i], int64_t(i));
  std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int64_t> out;
  for (int64_t j = 0; j < std::min<int64_t>(topk, int64_t(sc.size())); ++j) out.push_back(sc[size_t(j)].second);
  return out;
}

std::vector<double> values(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

at::Tensor long_tensor(const std::vector<int64_t>& v) { return at::tensor(v, at::TensorOptions().dtype(at::kLong)); }

// Per-head softmax of logits [H,S] over the allowed entries (mask [H,S] of 0/1 bytes; every row
// has one) -> (Σ_s p·v_s with v [S,H,Dv] -> [H,Dv], p).
std::pair<at::Tensor, at::Tensor> attend(const at::Tensor& logits, const std::vector<uint8_t>& allow, const at::Tensor& v) {
  const int64_t H = logits.size(0), S = logits.size(1);
  at::Tensor mask = at::tensor(std::vector<int64_t>(allow.begin(), allow.end()), at::TensorOptions().dtype(at::kLong))
                        .view({H, S}) > 0;
  at::Tensor l = logits.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor m = std::get<0>(l.max(1, true)).detach();
  at::Tensor e = (l - m).exp();
  at::Tensor p = e / e.sum(1, true);
  return {(p.transpose(0, 1).unsqueeze(-1) * v).sum(0), p};
}

// Rows of KL(p_r ‖ softmax(logits_r)) summed, p [R,C] detached and normalised, logits [R,C].
at::Tensor kl(const at::Tensor& p, const at::Tensor& logits) {
  at::Tensor m = std::get<0>(logits.max(1, true)).detach();
  at::Tensor logq = logits - m - (logits - m).exp().sum(1, true).log();
  return (p * (p.clamp_min(1e-300).log() - logq)).sum();
}

// Allow-mask row for keys s ≤ t of block `own` and of the blocks in `hist`.
void allow_blocks(std::vector<uint8_t>& row, int64_t t, int64_t block, int64_t own, const std::vector<int64_t>& hist) {
  std::vector<int64_t> blocks = hist;
  blocks.push_back(own);
  for (int64_t i : blocks)
    for (int64_t s = i * block; s < (i + 1) * block && s <= t; ++s) row[size_t(s)] = 1;
}

// Selection and candidate scores of a block layer's reference (layout [B,S,T,n+1]: n history
// blocks, −1 padded, then the own block; scores [B,S,T,NB]), filled row by row.
struct BlockRows {
  int64_t B, S, T, n, NB;
  std::vector<int64_t> chosen;
  std::vector<double> scores;
  at::Tensor forced;  // [B,S,T,n+1] int64 on the CPU, or undefined
  BlockRows(int64_t B_, int64_t S_, int64_t T_, int64_t n_, int64_t NB_, const LayerSelection* sel)
      : B(B_), S(S_), T(T_), n(n_), NB(NB_), chosen(size_t(B_ * S_ * T_ * (n_ + 1)), -1),
        scores(size_t(B_ * S_ * T_ * NB_), -std::numeric_limits<double>::infinity()) {
    if (sel && sel->forced.defined()) forced = sel->forced.to(at::kCPU, at::kLong).contiguous();
  }
  size_t row(int64_t b, int64_t s, int64_t t) const { return size_t((b * S + s) * T + t); }
  // Records row (b, s, t): the candidates' scores (blocks i < own), the own block, and the history
  // blocks attended — `own_choice` or, when forced, the forced row's history blocks (returned).
  std::vector<int64_t> take(int64_t b, int64_t s, int64_t t, int64_t own, const std::vector<double>& cand,
                            const std::vector<int64_t>& own_choice) {
    const size_t r = row(b, s, t);
    for (size_t i = 0; i < cand.size(); ++i) scores[r * size_t(NB) + i] = cand[i];
    scores[r * size_t(NB) + size_t(own)] = std::numeric_limits<double>::infinity();
    std::vector<int64_t> hist = own_choice;
    if (forced.defined()) {
      hist.clear();
      const int64_t* f = forced.data_ptr<int64_t>() + r * size_t(n + 1);
      for (int64_t j = 0; j < n; ++j)
        if (f[j] >= 0) hist.push_back(f[j]);
    }
    for (size_t j = 0; j < hist.size() && int64_t(j) < n; ++j) chosen[r * size_t(n + 1) + j] = hist[j];
    chosen[r * size_t(n + 1) + size_t(n)] = own;
    return hist;
  }
  void store(LayerSelection* sel) const {
    if (!sel) return;
    sel->chosen = forced.defined() ? forced : at::tensor(chosen, at::TensorOptions().dtype(at::kLong)).view({B, S, T, n + 1});
    sel->scores = at::tensor(scores, at::TensorOptions().dtype(at::kDouble)).view({B, S, T, NB});
  }
};

}  // namespace

at::Tensor block_topk(const at::Tensor& scores, int64_t block, int64_t topk, bool counted) {
  const int64_t B = scores.size(0), S = scores.size(1), T = scores.size(2), N = scores.size(3);
  const int64_t K = counted ? std::min(topk, N) : std::min(topk, N) + 1;
  std::vector<double> sc = values(scores);
  std::vector<int64_t> out;
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t c = t / block;
      const auto row = sc.begin() + (r * T + t) * N;
      std::vector<double> hist(row, row + std::min(c, N));  // candidates i < c
      std::vector<int64_t> sel = top(hist, K - 1);
      if (counted) sel.insert(sel.begin(), c);
      else sel.push_back(c);
      // −1 for the missing candidates, before the own block when it is appended
      while (int64_t(sel.size()) < K) sel.insert(counted ? sel.end() : sel.end() - 1, -1);
      out.insert(out.end(), sel.begin(), sel.end());
    }
  return long_tensor(out).view({B, S, T, K});
}

BlockOut qsa_layer(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                   int64_t idx_heads, int64_t idx_dim, int64_t group, int64_t rope_dim, int64_t block, int64_t topk,
                   LayerSelection* selection) {
  const int64_t B = x.size(0), T = x.size(1), H = s.n_head, G = s.n_head / s.n_kv_head, HK = idx_heads / group;
  const double scale = 1.0 / std::sqrt(double(s.head_dim));
  NanochatQKV a = layer_qkv(x, ve, w, s);
  at::Tensor ke = a.k.repeat_interleave(G, 2), vv = a.v.repeat_interleave(G, 2);  // [B,T,H,dh]
  at::Tensor xd = x.detach();
  const int64_t NC = T / block;
  BlockRows rows(B, 1, T, std::min(topk, NC), (T + block - 1) / block, selection);
  at::Tensor total = at::zeros({}, x.options().requires_grad(false));
  std::vector<at::Tensor> out_b;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> kbl;  // per complete block: [H_I, d_I] (pooled key head repeated per query head)
    for (int64_t i = 0; i < NC; ++i) {
      at::Tensor m = project(xd[b].narrow(0, i * block, block), get(w, "qsa_wk")).mean(0).view({HK, idx_dim});
      kbl.push_back(rope_at(rms(m), double(i * block), rope_dim, s.rope_base).repeat_interleave(group, 0));
    }
    at::Tensor kb = NC > 0 ? at::stack(kbl, 0) : at::Tensor();  // [NC,H_I,d_I]
    std::vector<at::Tensor> out_t;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cur = t / block;
      at::Tensor qi = rope_at(project(xd[b][t], get(w, "qsa_wq")).view({idx_heads, idx_dim}), double(t), rope_dim, s.rope_base);
      at::Tensor I;  // [cur]
      std::vector<int64_t> sel;
      std::vector<double> iv;
      if (cur > 0) {
        I = ((kb.narrow(0, 0, cur) * qi.unsqueeze(0)).sum(-1) / std::sqrt(double(idx_dim))).clamp_min(0.0).sum(-1);
        iv = values(I);
        sel = top(iv, topk);
      }
      sel = rows.take(b, 0, t, cur, iv, sel);
      std::vector<uint8_t> row(size_t(t + 1), 0);
      allow_blocks(row, t, block, cur, sel);
      std::vector<uint8_t> allow;
      for (int64_t h = 0; h < H; ++h) allow.insert(allow.end(), row.begin(), row.end());
      at::Tensor ks = ke[b].narrow(0, 0, t + 1), vs = vv[b].narrow(0, 0, t + 1);  // [t+1,H,dh]
      at::Tensor logits = (a.q[b][t].unsqueeze(0) * ks).sum(-1).transpose(0, 1) * scale;  // [H,t+1]
      auto [o, p] = attend(logits, allow, vs);
      out_t.push_back(o);
      if (sel.empty()) continue;
      std::vector<double> pv = values(p.detach().mean(0));  // [t+1], head mean
      std::vector<double> teacher;
      for (int64_t i : sel) {
        double mx = 0;
        for (int64_t u = i * block; u < (i + 1) * block; ++u) mx = std::max(mx, pv[size_t(u)]);
        teacher.push_back(mx);
      }
      at::Tensor pt = from_doubles(teacher, x.options().requires_grad(false));
      total = total + kl((pt / pt.sum()).unsqueeze(0), I.index_select(0, long_tensor(sel)).unsqueeze(0));
    }
    out_b.push_back(at::stack(out_t, 0));
  }
  at::Tensor y = at::stack(out_b, 0);
  rows.store(selection);
  return {project(y.reshape({B, T, H * s.head_dim}), get(w, "c_proj")), total / double(B * T)};
}

at::Tensor nsa_layer(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                     int64_t block, int64_t topk, int64_t window, LayerSelection* selection) {
  const int64_t B = x.size(0), T = x.size(1), H = s.n_head, Hkv = s.n_kv_head, G = H / Hkv, dh = s.head_dim;
  const double scale = 1.0 / std::sqrt(double(dh));
  NanochatQKV a = layer_qkv(x, ve, w, s);
  at::Tensor ke = a.k.repeat_interleave(G, 2), vv = a.v.repeat_interleave(G, 2);  // [B,T,H,dh]
  const int64_t NC = T / block;
  BlockRows rows(B, Hkv, T, std::min(topk, NC), (T + block - 1) / block, selection);
  std::vector<at::Tensor> out_b;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> kcl, vcl;  // per complete block: [H, dh] (KV head repeated per query head)
    for (int64_t i = 0; i < NC; ++i) {
      at::Tensor kblk = a.k[b].narrow(0, i * block, block).transpose(0, 1).reshape({Hkv, block * dh});
      at::Tensor vblk = a.v[b].narrow(0, i * block, block).transpose(0, 1).reshape({Hkv, block * dh});
      kcl.push_back(project(kblk, get(w, "nsa_cmp_k")).repeat_interleave(G, 0));
      vcl.push_back(project(vblk, get(w, "nsa_cmp_v")).repeat_interleave(G, 0));
    }
    std::vector<at::Tensor> out_t;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cur = t / block, nvis = (t + 1) / block;
      at::Tensor g = at::sigmoid(project(x[b][t], get(w, "nsa_gate"))).view({3, H, 1});
      at::Tensor qt = a.q[b][t];  // [H,dh]
      at::Tensor o_cmp = at::zeros({H, dh}, x.options().requires_grad(false));
      std::vector<std::vector<double>> score(static_cast<size_t>(Hkv), std::vector<double>(static_cast<size_t>(cur), 0.0));
      if (nvis > 0) {
        at::Tensor kc = at::stack(std::vector<at::Tensor>(kcl.begin(), kcl.begin() + nvis), 0);  // [nvis,H,dh]
        at::Tensor vc = at::stack(std::vector<at::Tensor>(vcl.begin(), vcl.begin() + nvis), 0);
        auto [o, p] = attend((qt.unsqueeze(0) * kc).sum(-1).transpose(0, 1) * scale,
                             std::vector<uint8_t>(size_t(H * nvis), 1), vc);
        o_cmp = o;
        std::vector<double> pv = values(p);  // [H,nvis]
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < cur; ++i) score[size_t(h / G)][size_t(i)] += pv[size_t(h * nvis + i)];
      }
      std::vector<std::vector<int64_t>> hist(static_cast<size_t>(Hkv));
      for (int64_t hk = 0; hk < Hkv; ++hk)
        hist[size_t(hk)] = rows.take(b, hk, t, cur, score[size_t(hk)], top(score[size_t(hk)], topk));
      std::vector<uint8_t> sel_allow, win_allow;
      for (int64_t h = 0; h < H; ++h) {
        std::vector<uint8_t> row(size_t(t + 1), 0), wrow(size_t(t + 1), 0);
        allow_blocks(row, t, block, cur, hist[size_t(h / G)]);
        for (int64_t u = std::max<int64_t>(0, t - window + 1); u <= t; ++u) wrow[size_t(u)] = 1;
        sel_allow.insert(sel_allow.end(), row.begin(), row.end());
        win_allow.insert(win_allow.end(), wrow.begin(), wrow.end());
      }
      at::Tensor ks = ke[b].narrow(0, 0, t + 1), vs = vv[b].narrow(0, 0, t + 1);
      at::Tensor logits = (qt.unsqueeze(0) * ks).sum(-1).transpose(0, 1) * scale;  // [H,t+1]
      at::Tensor o_slc = attend(logits, sel_allow, vs).first, o_win = attend(logits, win_allow, vs).first;
      out_t.push_back(g[0] * o_cmp + g[1] * o_slc + g[2] * o_win);
    }
    out_b.push_back(at::stack(out_t, 0));
  }
  at::Tensor y = at::stack(out_b, 0);
  rows.store(selection);
  return project(y.reshape({B, T, H * dh}), get(w, "c_proj"));
}

BlockOut seer_layer(const at::Tensor& x, const at::Tensor& ve, const BlockLayerWeights& w, const BlockLayerShape& s,
                    int64_t block, int64_t topk, bool pooled_rope, LayerSelection* selection) {
  const int64_t B = x.size(0), T = x.size(1), H = s.n_head, Hkv = s.n_kv_head, G = H / Hkv, dh = s.head_dim;
  const double scale = 1.0 / std::sqrt(double(dh));
  NanochatQKV a = layer_qkv(x, ve, w, s);
  const at::Tensor gate_k = pooled_rope ? layer_qkv(x, ve, w, s, /*rope=*/false).k.detach() : a.k.detach();
  at::Tensor ke = a.k.repeat_interleave(G, 2), vv = a.v.repeat_interleave(G, 2);  // [B,T,H,dh]
  at::Tensor qd = a.q.detach(), kd = ke.detach();
  const at::Tensor &wq = get(w, "seer_wq"), &wk = get(w, "seer_wk");
  const double sg = 1.0 / std::sqrt(double(wq.size(1)));
  const int64_t NC = T / block;
  BlockRows rows(B, H, T, std::min(topk, NC), (T + block - 1) / block, selection);
  at::Tensor total = at::zeros({}, x.options().requires_grad(false));
  std::vector<at::Tensor> out_b;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> kgl;  // per complete block: [H, d_g] (KV head's gate key repeated per query head)
    for (int64_t i = 0; i < NC; ++i) {
      at::Tensor blk = gate_k[b].narrow(0, i * block, block);  // [block,Hkv,dh]
      at::Tensor pooled = at::cat({std::get<0>(blk.max(0)), std::get<0>(blk.min(0)), blk.mean(0)}, -1);  // [Hkv,3dh]
      at::Tensor kgi = (pooled.unsqueeze(1) * wk).sum(-1);  // [Hkv,d_g]
      // nanochat's rotation (by −θ in rope_at's NeoX terms) at the block's first position
      if (pooled_rope) kgi = rope_at(kgi, -double(i * block), kgi.size(-1), s.rope_base);
      kgl.push_back(kgi.repeat_interleave(G, 0));
    }
    at::Tensor kg = NC > 0 ? at::stack(kgl, 0) : at::Tensor();  // [NC,H,d_g]
    std::vector<at::Tensor> out_t;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t cur = t / block;
      std::vector<std::vector<int64_t>> sel(static_cast<size_t>(H));
      at::Tensor S;  // [H,cur]
      std::vector<double> sv;
      if (cur > 0) {
        at::Tensor qg = (qd[b][t].unsqueeze(1) * wq).sum(-1);  // [H,d_g]
        S = (kg.narrow(0, 0, cur) * qg.unsqueeze(0)).sum(-1).transpose(0, 1) * sg;
        sv = values(S);
      }
      for (int64_t h = 0; h < H; ++h) {
        const std::vector<double> row(sv.begin() + h * cur, sv.begin() + (h + 1) * cur);
        sel[size_t(h)] = rows.take(b, h, t, cur, row, top(row, topk));
      }
      std::vector<uint8_t> allow;
      for (int64_t h = 0; h < H; ++h) {
        std::vector<uint8_t> row(size_t(t + 1), 0);
        allow_blocks(row, t, block, cur, sel[size_t(h)]);
        allow.insert(allow.end(), row.begin(), row.end());
      }
      at::Tensor ks = ke[b].narrow(0, 0, t + 1), vs = vv[b].narrow(0, 0, t + 1);
      at::Tensor logits = (a.q[b][t].unsqueeze(0) * ks).sum(-1).transpose(0, 1) * scale;  // [H,t+1]
      out_t.push_back(attend(logits, allow, vs).first);
      if (cur == 0) continue;
      // Teacher: full causal attention per head (detached), block-max over the history blocks.
      at::Tensor ld = (qd[b][t].unsqueeze(0) * kd[b].narrow(0, 0, t + 1)).sum(-1).transpose(0, 1) * scale;
      std::vector<double> A = values(at::softmax(ld, 1));
      std::vector<double> gt;
      for (int64_t h = 0; h < H; ++h) {
        double sum = 0;
        std::vector<double> r;
        for (int64_t i = 0; i < cur; ++i) {
          double mx = 0;
          for (int64_t u = i * block; u < (i + 1) * block; ++u) mx = std::max(mx, A[size_t(h * (t + 1) + u)]);
          r.push_back(mx);
          sum += mx;
        }
        for (double v : r) gt.push_back(v / sum);
      }
      total = total + kl(from_doubles(gt, x.options().requires_grad(false)).view({H, cur}), S);
    }
    out_b.push_back(at::stack(out_t, 0));
  }
  at::Tensor y = at::stack(out_b, 0);
  rows.store(selection);
  return {project(y.reshape({B, T, H * dh}), get(w, "c_proj")), total / double(B * T * H)};
}

}  // namespace mixbench::reference
