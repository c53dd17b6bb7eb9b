// Op `block_sparse_attention`: causal attention over selected key blocks.
//   q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv],
//   block_indices [B,Hkv,NQ,topk] int64 (−1 = empty slot, anywhere in the row),
// with key blocks of `block_size` tokens (block i holds keys i·bs … min((i+1)·bs, T) − 1; the last
// block may be partial) and query rows of `q_block` consecutive queries (0 = block_size), so
// NQ = ceil(T / q_block). Query t (row r = t / q_block) of query head h attends, through KV head
// h / (H/Hkv), to every key s ≤ t lying in a block listed in block_indices[b, h_kv, r, :] —
// token-causal inside a block. Softmax over those keys only (scale 0 = D^-0.5); a query that sees
// no key gets o_t = 0. Each row lists distinct blocks that start no later than the row's last
// query (min(T−1, (r+1)·q_block − 1)). block_indices carry no gradient.
//
// q_block = 1 gives per-query block selection (MoBA's gate picks blocks per token and head);
// q_block = block_size gives the FlexAttention / NSA-kernel layout (one selection per query block).
//
// CPU path: the selected blocks of K and V are gathered once per (batch, KV head, query row) —
// [B,Hkv,NQ,topk·bs,D] — and the row's q_block·G queries attend to them with two batched matmuls
// and a masked softmax. Every slot is computed, including empty (−1) slots and the masked future
// part of a block: per query 4·D·topk·bs FLOPs (times NQ·q_block/T for the padded last row).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <limits>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/common/qkv_op.h"
#include "mixers/sparse/sparse.h"
#include "reference/sparse.h"

namespace mixbench {

namespace {

using qkv_op::resolve_scale;

int64_t q_block_of(const Config& p) { return p.i("q_block") > 0 ? p.i("q_block") : p.i("block_size"); }

void check_block_inputs(const TensorMap& in, const Config& p) {
  const char* op = "block_sparse_attention";
  qkv_op::check_inputs(op, in, {"block_indices"});
  const auto &q = in.at("q"), &idx = in.at("block_indices");
  const int64_t B = q.size(0), T = q.size(1), Hkv = in.at("k").size(2);
  if (idx.scalar_type() != at::kLong)
    throw InputError(fmt::format("{}: 'block_indices' must be int64, got {}", op, c10::toString(idx.scalar_type())));
  const int64_t bs = p.i("block_size"), qb = q_block_of(p);
  const int64_t NQ = (T + qb - 1) / qb, NB = (T + bs - 1) / bs;
  if (idx.dim() != 4 || idx.size(0) != B || idx.size(1) != Hkv || idx.size(2) != NQ || idx.size(3) != p.i("topk"))
    throw InputError(fmt::format("{}: 'block_indices' must be [B,Hkv,ceil(T/q_block),topk] = [{},{},{},{}], got {}", op,
                                 B, Hkv, NQ, p.i("topk"), c10::str(idx.sizes())));
  at::Tensor ic = idx.to(at::kCPU).contiguous();
  if (ic.numel() == 0) return;
  if ((ic < -1).any().item<bool>())
    throw InputError(fmt::format("{}: 'block_indices' holds {} (only −1 may pad an empty slot)", op,
                                 ic.min().item<int64_t>()));
  if ((ic >= NB).any().item<bool>())
    throw InputError(fmt::format("{}: 'block_indices' holds block {} but T = {} has {} blocks of {}", op,
                                 ic.max().item<int64_t>(), T, NB, bs));
  // A row may select a block only if it starts at or before the row's last query.
  at::Tensor last = (at::arange(NQ, ic.options()) * qb + (qb - 1)).clamp_max(T - 1).view({1, 1, NQ, 1});
  at::Tensor bad = ic * bs > last;
  if (bad.any().item<bool>()) {
    at::Tensor w = bad.nonzero()[0];
    const int64_t b = w[0].item<int64_t>(), h = w[1].item<int64_t>(), r = w[2].item<int64_t>(), j = w[3].item<int64_t>();
    throw InputError(fmt::format("{}: non-causal block: block_indices[{},{},{},{}] = {} starts after query row {}'s last query",
                                 op, b, h, r, j, ic[b][h][r][j].item<int64_t>(), r));
  }
  if (ic.size(3) > 1) {
    at::Tensor srt = std::get<0>(ic.sort(-1));
    at::Tensor dup = (srt.slice(3, 1) == srt.slice(3, 0, -1)).logical_and(srt.slice(3, 1) >= 0);
    if (dup.any().item<bool>()) {
      at::Tensor w = dup.nonzero()[0];
      throw InputError(fmt::format("{}: 'block_indices' row [{},{},{}] selects block {} twice", op,
                                   w[0].item<int64_t>(), w[1].item<int64_t>(), w[2].item<int64_t>(),
                                   srt[w[0]][w[1]][w[2]][w[3]].item<int64_t>()));
    }
  }
}

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_block_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", reference::block_sparse_attention(q, in.at("k"), in.at("v"), in.at("block_indices"),
                                                  p.i("block_size"), q_block_of(p), resolve_scale(p, q.size(3)))}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_block_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", block_sparse_attention_cpu(q, in.at("k"), in.at("v"), in.at("block_indices"), p.i("block_size"),
                                           q_block_of(p), resolve_scale(p, q.size(3)))}};
}

// Random causal block selections: each row picks min(topk, available) distinct blocks among those
// starting at or before its last query, shuffled across the slots with the −1 padding.
at::Tensor random_block_indices(int64_t B, int64_t Hkv, int64_t T, int64_t bs, int64_t qb, int64_t topk,
                                at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t NQ = (T + qb - 1) / qb, NB = (T + bs - 1) / bs;
  at::Tensor r = at::rand({B, Hkv, NQ, NB}, gen, o);
  at::Tensor last = (at::arange(NQ) * qb + (qb - 1)).clamp_max(T - 1).view({-1, 1});
  at::Tensor future = (at::arange(NB).view({1, -1}) * bs) > last;  // [NQ,NB]
  r = r.masked_fill(future.view({1, 1, NQ, NB}), 2.0);
  at::Tensor order = std::get<1>(r.sort(-1));
  const int64_t S = std::min(topk, NB);
  at::Tensor sel = order.slice(3, 0, S);
  sel = sel.masked_fill((at::gather(r, 3, sel) < 2.0).logical_not(), -1);
  if (topk > S) sel = at::cat({sel, at::full({B, Hkv, NQ, topk - S}, -1, sel.options())}, 3);
  at::Tensor perm = std::get<1>(at::rand({B, Hkv, NQ, topk}, gen, o).sort(-1));
  return at::gather(sel, 3, perm).contiguous();
}

TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  TensorMap m = qkv_op::make_inputs(c, B, T, gen);
  m.set("block_indices", random_block_indices(B, c.i("Hkv"), T, c.i("block_size"), q_block_of(c), c.i("topk"), gen));
  return m;
}

ConfigSpec params_spec() {
  return qkv_op::params("block_sparse_attention", [](ConfigSpec& s) {
    s.i("block_size", 16, "keys per block", 1)
        .i("q_block", 0, "consecutive queries sharing one row of block_indices; 0 = block_size", 0)
        .i("topk", 4, "block slots per row (last dim of block_indices)", 1);
  });
}

std::vector<CaseDef> cases() {
  ConfigSpec s = params_spec();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  return {
      {"T1", c("H=2,Hkv=2,D=8,block_size=4,topk=2"), 1, 1},
      {"odd_B2", c("H=4,Hkv=4,D=16,block_size=8,topk=3"), 2, 37},
      {"gqa", c("H=4,Hkv=2,D=16,block_size=8,topk=2"), 2, 45},
      {"mqa", c("H=4,Hkv=1,D=8,block_size=5,topk=3"), 1, 33},
      {"per_query_rows", c("H=2,Hkv=2,D=8,block_size=4,q_block=1,topk=2"), 2, 23},
      {"q_block_lt_block", c("H=4,Hkv=2,D=8,block_size=8,q_block=3,topk=2"), 1, 31},
      {"q_block_gt_block", c("H=2,Hkv=1,D=8,block_size=4,q_block=10,topk=3"), 2, 27},
      {"topk_gt_blocks", c("H=2,Hkv=2,D=8,block_size=4,topk=16"), 1, 21},
      {"block1_tokens", c("H=2,Hkv=2,D=8,block_size=1,topk=5"), 1, 17},
      {"gqa_T150", c("H=4,Hkv=2,D=16,block_size=16,topk=4"), 2, 150},
      {"scale_Dv", c("H=2,Hkv=2,D=8,Dv=12,scale=0.3,block_size=6,topk=2"), 2, 19},
  };
}

// Every causal block selected must give dense causal attention: this op's reference and optimized
// path against the `attention` op's reference (window 0, no logit scale).
std::vector<std::pair<std::string, double>> dense_equivalence(const TensorMap& in, const Config& p, Backend b,
                                                              at::ScalarType dt) {
  const at::Tensor& q = in.at("q");
  const int64_t B = q.size(0), T = q.size(1), Hkv = in.at("k").size(2);
  const int64_t bs = p.i("block_size"), qb = q_block_of(p), NQ = (T + qb - 1) / qb, NB = (T + bs - 1) / bs;
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor blk = at::arange(NB, lo).view({1, NB});
  at::Tensor last = (at::arange(NQ, lo) * qb + (qb - 1)).clamp_max(T - 1).view({NQ, 1});
  at::Tensor all = blk.expand({NQ, NB}).masked_fill(blk * bs > last, -1).view({1, 1, NQ, NB}).expand({B, Hkv, NQ, NB});
  TensorMap full{{"q", q}, {"k", in.at("k")}, {"v", in.at("v")}, {"block_indices", all.contiguous()}};
  return dense_equivalence_of("block_sparse_attention", full, p.with("topk", NB), resolve_scale(p, q.size(3)), b, dt);
}

OpSpec make_spec() {
  OpSpec s = qkv_op::spec(
      "block_sparse_attention", "sparse",
      "causal attention over selected key blocks per (KV head, query row), −1 padded, token-causal inside blocks, GQA",
      "MoBA (MoonshotAI/MoBA moba_naive); NSA selection branch (arXiv 2502.11089 §3.3.2)", params_spec(),
      {{"block_indices", /*differentiable=*/false}}, check_block_inputs);
  s.make_inputs = make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
  // device-agnostic LibTorch (gathers and batched products) in fp32; no dedicated kernel
  s.cuda = [](const TensorMap& in, const Config& p) { return run_in_fp32(cpu_fn, in, p); };
  s.cases = cases;
  s.invariants = dense_equivalence;
  return s;
}

}  // namespace

at::Tensor block_sparse_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& block_indices, int64_t bs, int64_t qb, double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(2), Dv = v.size(3), G = H / Hkv;
  const int64_t NQ = block_indices.size(2), nb = block_indices.size(3);
  const int64_t NB = (T + bs - 1) / bs, Tk = NB * bs, Tq = NQ * qb;
  at::Tensor idx = block_indices.to(q.device());
  auto lo = idx.options();
  // Blocks as rows: [B·Hkv·NB, bs, D] (keys past T are zero padding, masked below).
  at::Tensor kp = at::constant_pad_nd(k, {0, 0, 0, 0, 0, Tk - T});
  at::Tensor vp = at::constant_pad_nd(v, {0, 0, 0, 0, 0, Tk - T});
  at::Tensor kb = kp.reshape({B, NB, bs, Hkv, D}).permute({0, 3, 1, 2, 4}).reshape({B * Hkv * NB, bs, D});
  at::Tensor vb = vp.reshape({B, NB, bs, Hkv, Dv}).permute({0, 3, 1, 2, 4}).reshape({B * Hkv * NB, bs, Dv});
  at::Tensor base = (at::arange(B, lo) * (Hkv * NB)).view({B, 1, 1, 1}) + (at::arange(Hkv, lo) * NB).view({1, Hkv, 1, 1});
  at::Tensor flat = (idx.clamp_min(0) + base).reshape({-1});
  at::Tensor kg = kb.index_select(0, flat).view({B, Hkv, NQ, nb * bs, D});
  at::Tensor vg = vb.index_select(0, flat).view({B, Hkv, NQ, nb * bs, Dv});
  // Key positions of the gathered slots and whether each slot holds a real key.
  at::Tensor kpos = (idx.clamp_min(0) * bs).unsqueeze(-1) + at::arange(bs, lo);            // [B,Hkv,NQ,nb,bs]
  at::Tensor kval = (idx >= 0).unsqueeze(-1).logical_and(kpos < T).reshape({B, Hkv, NQ, 1, nb * bs});
  kpos = kpos.reshape({B, Hkv, NQ, 1, nb * bs});
  // Queries of a row (q_block positions × G heads of the group): [B,Hkv,NQ,qb·G,D].
  at::Tensor qp = at::constant_pad_nd(q, {0, 0, 0, 0, 0, Tq - T});
  at::Tensor qg = qp.reshape({B, NQ, qb, Hkv, G, D}).permute({0, 3, 1, 2, 4, 5}).reshape({B, Hkv, NQ, qb * G, D});
  at::Tensor qpos = at::arange(Tq, lo).view({NQ, qb, 1}).expand({NQ, qb, G}).reshape({1, 1, NQ, qb * G, 1});
  at::Tensor vis = kval.logical_and(kpos <= qpos);                                          // [B,Hkv,NQ,qb·G,nb·bs]
  at::Tensor logits = at::matmul(qg, kg.transpose(-1, -2)) * scale;
  at::Tensor any = vis.any(-1, true);
  // Rows without a visible key keep finite logits (then zeroed) so that no NaN reaches autograd.
  logits = logits.masked_fill(vis.logical_not().logical_and(any), -std::numeric_limits<double>::infinity());
  at::Tensor p = at::softmax(logits, -1).masked_fill(vis.logical_not(), 0.0);
  at::Tensor o = at::matmul(p, vg);                                                         // [B,Hkv,NQ,qb·G,Dv]
  o = o.view({B, Hkv, NQ, qb, G, Dv}).permute({0, 2, 3, 1, 4, 5}).reshape({B, Tq, H, Dv});
  return o.slice(1, 0, T);
}

at::Tensor block_sparse_attention_fast(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& block_indices, int64_t bs, int64_t qb, double scale) {
  return block_sparse_attention_cpu(up_to_fp32(q), up_to_fp32(k), up_to_fp32(v), block_indices, bs, qb, scale)
      .to(q.scalar_type());
}

MIXBENCH_REGISTER(make_spec());

}  // namespace mixbench
