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
//
// CUDA path (after the op's checks) = block_sparse_attention_fast: for bf16 / fp16 with D = Dv ∈
// {64, 128}, q_block 1 and block_size ≥ 16 the tensor-core kernels of block_sparse_mma.cu; for the
// other fp32 / bf16 / fp16 inputs with D = Dv ∈ {64, 128} the CUDA-core kernels of
// block_sparse_kernel.cu (both compute only the visible keys of the listed blocks, the tensor cores
// in tiles of 16 … 64 keys); otherwise the LibTorch code above in fp32.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <limits>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/common/qkv_op.h"
#include "mixers/sparse/sparse.h"
#include "reference/sparse.h"

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "mixers/sparse/block_sparse_kernel.h"
#include "mixers/sparse/block_sparse_mma.h"
#endif

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

// The layers' entry point after the op's checks: the CUDA kernels where they apply (fp32 / bf16 /
// fp16, D = Dv ∈ {64, 128}), else the LibTorch path in fp32.
TensorMap cuda_fn(const TensorMap& in, const Config& p) {
  check_block_inputs(in, p);
  const auto& q = in.at("q");
  return {{"o", block_sparse_attention_fast(q, in.at("k"), in.at("v"), in.at("block_indices"), p.i("block_size"),
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
      // head dims of the CUDA kernels (per-token rows with GQA; q_block = block_size, a partial block)
      {"kernel_d64_rows", c("H=4,Hkv=2,D=64,block_size=4,q_block=1,topk=5"), 2, 41},
      {"kernel_d128", c("H=2,Hkv=1,D=128,block_size=16,topk=3"), 1, 70},
      // the tensor-core kernels' shape at bf16 / fp16 (per-token rows, blocks of 16, a partial block)
      {"kernel_mma_rows", c("H=4,Hkv=2,D=64,block_size=16,q_block=1,topk=3"), 1, 53},
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
  s.cuda = cuda_fn;
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

#if defined(MIXBENCH_WITH_CUDA)
namespace {

// The CUDA kernels take q, k, v of one floating type on one GPU, D = Dv ∈ {64, 128}, index ranges
// that fit int32 (the transposed selection's offsets) and B·Hkv ≤ 65535.
bool bsa_kernel_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx,
                        int64_t bs, int64_t qb) {
  if (!q.is_cuda() || !k.is_cuda() || !v.is_cuda() || k.device() != q.device() || v.device() != q.device()) return false;
  const auto dt = q.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return false;
  if (k.scalar_type() != dt || v.scalar_type() != dt || idx.scalar_type() != at::kLong) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || idx.dim() != 4) return false;
  const int64_t D = q.size(3);
  if (!bsa_cuda::supported_head_dim(int(D)) || k.size(3) != D || v.size(3) != D) return false;
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Hkv = k.size(2);
  if (Hkv <= 0 || H % Hkv != 0 || bs <= 0 || qb <= 0 || B * T * H == 0) return false;
  const int64_t lim = std::numeric_limits<int32_t>::max() / 2;
  return idx.numel() < lim && T < lim && B * Hkv * ((T + bs - 1) / bs) < lim && B * Hkv <= 65535;  // grid.y = B·Hkv
}

bsa_cuda::Dtype bsa_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kFloat ? bsa_cuda::Dtype::F32
         : x.scalar_type() == at::kBFloat16 ? bsa_cuda::Dtype::BF16
                                            : bsa_cuda::Dtype::F16;
}

bsa_cuda::Shape bsa_shape(const at::Tensor& q, const at::Tensor& k, const at::Tensor& idx, int64_t bs, int64_t qb,
                          double scale) {
  return {int(q.size(0)), int(q.size(1)), int(q.size(2)), int(k.size(2)), int(q.size(3)), int(bs), int(qb),
          int(idx.size(2)), int(idx.size(3)), float(scale)};
}

// The tensor-core kernels (block_sparse_mma.cu) take bf16 / fp16, D ∈ {64, 128}, q_block 1 and
// blocks of at least 16 keys, on 16-byte aligned q, k, v (vector loads of 8 elements; the forward
// copies a non-contiguous input into a fresh, aligned tensor).
bool bsa_mma_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& idx, int64_t bs,
                     int64_t qb) {
  if (!bsa_kernel_applies(q, k, v, idx, bs, qb) || q.scalar_type() == at::kFloat) return false;
  const bsa_cuda::Shape s = bsa_shape(q, k, idx, bs, qb, 1.0);
  auto aligned = [](const at::Tensor& x) {
    return !x.is_contiguous() || reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  };
  return bsa_mma::applies(bsa_dtype(q), s) && aligned(q) && aligned(k) && aligned(v);
}

// The transposed selection of the tensor-core kernels, built on the device: ents[row_off[seg] …] =
// r·topk + j for the slots listing block seg = (b, h_kv, i); the work items' offsets of the forward
// (fwd_off) and the backward (bwd_off).
struct Transposed {
  at::Tensor row_off, fwd_off, bwd_off, ents;
};
Transposed transpose_selection(const bsa_cuda::Shape& s, const at::Tensor& idx, cudaStream_t st) {
  auto i32 = idx.options().dtype(at::kInt);
  const int64_t S = s.segments(), G = s.H / s.Hkv;
  at::Tensor count = at::zeros({S}, i32);
  bsa_cuda::count_selections(s, idx.data_ptr<int64_t>(), count.data_ptr<int>(), st);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  Transposed x{at::zeros({S + 1}, i32), at::zeros({S + 1}, i32), at::zeros({S + 1}, i32), at::Tensor()};
  x.row_off.slice(0, 1).copy_(at::cumsum(count, 0, at::kInt));
  x.fwd_off.slice(0, 1).copy_(at::cumsum(at::div(count * G + (bsa_mma::kFwdUnit - 1), bsa_mma::kFwdUnit, "floor"), 0, at::kInt));
  x.bwd_off.slice(0, 1).copy_(at::cumsum(at::div(count * G + (bsa_mma::kBwdUnit - 1), bsa_mma::kBwdUnit, "floor"), 0, at::kInt));
  at::Tensor cursor = at::zeros({S}, i32);
  x.ents = at::empty({std::max<int64_t>(s.entries(), 1)}, i32);
  bsa_mma::fill_entries(s, idx.data_ptr<int64_t>(), x.row_off.data_ptr<int>(), cursor.data_ptr<int>(), x.ents.data_ptr<int>(), st);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return x;
}

// The kernels' forward (o and the row log-sum-exp) and backward. CUDA cores (`mma` false): dq
// query-stationary; dk, dv key-block-stationary over the transposed selection, built on the device.
// Tensor cores (`mma` true): everything key-block-stationary over the transposed selection with
// slots, built in the forward and kept for the backward; o, dq, dk, dv accumulated in fp32.
struct BlockSparseCudaFn : public torch::autograd::Function<BlockSparseCudaFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& idx, int64_t bs, int64_t qb, double scale, bool mma) {
    const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    const at::Tensor ic = idx.to(q.device()).contiguous();
    const bsa_cuda::Shape s = bsa_shape(qc, kc, ic, bs, qb, scale);
    const cudaStream_t st = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
    at::Tensor o, lse = at::empty({s.B, s.T, s.H}, qc.options().dtype(at::kFloat));
    Transposed x;
    if (mma) {
      x = transpose_selection(s, ic, st);
      const int64_t G = s.H / s.Hkv;
      at::Tensor ml = at::empty({std::max<int64_t>(s.entries() * G, 1), 2}, qc.options().dtype(at::kFloat));
      at::Tensor o_acc = at::zeros(qc.sizes(), qc.options().dtype(at::kFloat));
      bsa_mma::forward(bsa_dtype(qc), s, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), ic.data_ptr<int64_t>(),
                       x.row_off.data_ptr<int>(), x.fwd_off.data_ptr<int>(), x.ents.data_ptr<int>(),
                       reinterpret_cast<float2*>(ml.data_ptr<float>()), lse.data_ptr<float>(), o_acc.data_ptr<float>(), st);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      o = o_acc.to(qc.scalar_type());
    } else {
      o = at::empty_like(qc);
      bsa_cuda::forward(bsa_dtype(qc), s, qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), ic.data_ptr<int64_t>(), o.data_ptr(),
                        lse.data_ptr<float>(), st);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    ctx->save_for_backward({qc, kc, vc, ic, o, lse, x.row_off, x.bwd_off, x.ents});
    ctx->saved_data["bs"] = bs;
    ctx->saved_data["qb"] = qb;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["mma"] = mma;
    return o;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    const auto sv = ctx->get_saved_variables();
    const at::Tensor &q = sv[0], &k = sv[1], &v = sv[2], &idx = sv[3], &o = sv[4], &lse = sv[5];
    const at::Tensor none;
    if (!g[0].defined()) return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v), none, none, none, none, none};
    const bsa_cuda::Shape s = bsa_shape(q, k, idx, ctx->saved_data["bs"].toInt(), ctx->saved_data["qb"].toInt(),
                                        ctx->saved_data["scale"].toDouble());
    at::Tensor dout = g[0].to(q.scalar_type()).contiguous();
    const cudaStream_t st = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
    const auto dt = bsa_dtype(q);
    auto f32 = q.options().dtype(at::kFloat);
    at::Tensor dk = at::zeros(k.sizes(), f32), dv = at::zeros(v.sizes(), f32);
    if (ctx->saved_data["mma"].toBool()) {
      const at::Tensor &row_off = sv[6], &bwd_off = sv[7], &ents = sv[8];
      // 16-byte vector loads: a contiguous view at an odd offset is copied
      if (reinterpret_cast<uintptr_t>(dout.data_ptr()) % 16 != 0) dout = dout.clone();
      const at::Tensor delta = (dout.to(at::kFloat) * o.to(at::kFloat)).sum(-1);  // [B,T,H]
      at::Tensor dq = at::zeros(q.sizes(), f32);
      bsa_mma::backward(dt, s, q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), lse.data_ptr<float>(),
                        delta.data_ptr<float>(), row_off.data_ptr<int>(), bwd_off.data_ptr<int>(), ents.data_ptr<int>(),
                        dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(), st);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), none, none, none, none, none};
    }
    auto i32 = q.options().dtype(at::kInt);
    at::Tensor dq = at::empty_like(q), delta = at::empty({s.B, s.T, s.H}, f32);
    bsa_cuda::backward_dq(dt, s, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), dout.data_ptr(),
                          idx.data_ptr<int64_t>(), lse.data_ptr<float>(), dq.data_ptr(), delta.data_ptr<float>(), st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // The transposed selection: rows[row_off[seg] …] = the query rows listing block seg = (b, h_kv, i).
    const int64_t S = s.segments();
    at::Tensor count = at::zeros({S}, i32);
    bsa_cuda::count_selections(s, idx.data_ptr<int64_t>(), count.data_ptr<int>(), st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    at::Tensor row_off = at::zeros({S + 1}, i32), item_off = at::zeros({S + 1}, i32);
    const int R = s.rows_per_item();
    row_off.slice(0, 1).copy_(at::cumsum(count, 0, at::kInt));
    item_off.slice(0, 1).copy_(at::cumsum(at::div(count + (R - 1), R, "floor"), 0, at::kInt));
    at::Tensor cursor = at::zeros({S}, i32), rows = at::empty({std::max<int64_t>(s.entries(), 1)}, i32);
    bsa_cuda::fill_selections(s, idx.data_ptr<int64_t>(), row_off.data_ptr<int>(), cursor.data_ptr<int>(),
                              rows.data_ptr<int>(), st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    bsa_cuda::backward_dkdv(dt, s, q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), lse.data_ptr<float>(),
                            delta.data_ptr<float>(), row_off.data_ptr<int>(), item_off.data_ptr<int>(), rows.data_ptr<int>(),
                            dk.data_ptr<float>(), dv.data_ptr<float>(), st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (q.scalar_type() != at::kFloat) {
      dk = dk.to(k.scalar_type());
      dv = dv.to(v.scalar_type());
    }
    return {dq, dk, dv, none, none, none, none, none};
  }
};

}  // namespace
#endif

namespace {
thread_local BlockSparseKernels fast_kernels = BlockSparseKernels::Auto;
}  // namespace

ScopedBlockSparseKernels::ScopedBlockSparseKernels(BlockSparseKernels which) : prev_(fast_kernels) { fast_kernels = which; }
ScopedBlockSparseKernels::~ScopedBlockSparseKernels() { fast_kernels = prev_; }

at::Tensor block_sparse_attention_fast(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& block_indices, int64_t bs, int64_t qb, double scale) {
#if defined(MIXBENCH_WITH_CUDA)
  if (bsa_kernel_applies(q, k, v, block_indices, bs, qb)) {
    BlockSparseKernels which = fast_kernels;
    if (which == BlockSparseKernels::TensorCores && !bsa_mma_applies(q, k, v, block_indices, bs, qb))
      which = BlockSparseKernels::CudaCores;
    return block_sparse_attention_cuda(q, k, v, block_indices, bs, qb, scale, which);
  }
#endif
  return block_sparse_attention_cpu(up_to_fp32(q), up_to_fp32(k), up_to_fp32(v), block_indices, bs, qb, scale)
      .to(q.scalar_type());
}

at::Tensor block_sparse_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& block_indices, int64_t bs, int64_t qb, double scale,
                                       BlockSparseKernels which) {
#if defined(MIXBENCH_WITH_CUDA)
  if (!bsa_kernel_applies(q, k, v, block_indices, bs, qb))
    throw UsageError("block_sparse_attention_cuda: the CUDA kernels need q, k, v of one floating type on one GPU, "
                     "D = Dv in {64, 128} and int64 block indices");
  const bool mma_ok = bsa_mma_applies(q, k, v, block_indices, bs, qb);
  if (which == BlockSparseKernels::TensorCores && !mma_ok)
    throw UsageError(fmt::format("block_sparse_attention_cuda: the tensor-core kernels need bf16/fp16, D in {{64, 128}}, "
                                 "q_block 1 and block_size >= 16 (got {}, D {}, q_block {}, block_size {})",
                                 c10::toString(q.scalar_type()), q.size(3), qb, bs));
  const bool mma = which == BlockSparseKernels::TensorCores || (which == BlockSparseKernels::Auto && mma_ok);
  note_kernel(mma ? "block_sparse_mma" : "block_sparse_cuda");
  return BlockSparseCudaFn::apply(q, k, v, block_indices, bs, qb, scale, mma);
#else
  throw UsageError("block_sparse_attention_cuda: built without CUDA");
#endif
}

MIXBENCH_REGISTER(make_spec());

}  // namespace mixbench
