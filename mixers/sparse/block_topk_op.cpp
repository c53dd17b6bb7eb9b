// Op `block_topk`: the block selection of the block-sparse methods from their block scores.
//   scores [B,S,T,N] (S selection rows per token: query heads for moba and seer, KV heads for nsa,
//   1 for qsa; N scored blocks of block_size keys, N ≤ ceil(T / block_size)) -> block_indices
//   [B,S,T,K] int64 (−1 = empty slot), the layout of block_sparse_attention with q_block 1
//   (own = counted scores every block: N = ceil(T / block_size)).
// Query t's own block is c = t / block_size; `own` says how it enters the selection:
//   appended (nsa, seer, qsa; seed 001 "complete blocks plus the unfinished tail block"): the
//     candidates are the complete history blocks i < c (i < N); K = min(topk, N) + 1: the best
//     candidates in descending score, −1 where there are fewer, then the own block c;
//   counted (moba): the candidates are the blocks i ≤ c (i < N), the own block always chosen and
//     counted among the topk; K = min(topk, N): the own block first, then the best other
//     candidates in descending score, −1 padded.
// Ties go to the lower block: a stable descending sort on CPU; on CUDA (and in block_topk_fast for
// fp32 scores on any device) the same order through topk_lowest_index, at::topk on int64 keys that
// pack score and block, with no sort of the whole row. Another top-k (torch.topk) keeps other tied
// blocks, which is as correct: the selection is compared as a set per row and
// blocks tied with the k-th score may be exchanged (OpSpec::selection_scores: the scores of the
// candidates, −inf for the blocks that are none, +inf for the own block, which is forced and never
// a tie). Scores carry no gradient.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <limits>

#include "harness/errors.h"
#include "harness/registry.h"
#include "mixers/sparse/sparse.h"
#include "reference/sparse_blocks.h"

namespace mixbench {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool own_counted(const Config& p) { return p.s("own") == "counted"; }

void check_scores(const TensorMap& in, const Config& p) {
  if (!in.has("scores")) throw InputError("block_topk: missing input 'scores'");
  const at::Tensor& s = in.at("scores");
  if (!at::isFloatingType(s.scalar_type()))
    throw InputError(fmt::format("block_topk: 'scores' must be a floating tensor, got {}", c10::toString(s.scalar_type())));
  if (s.dim() != 4) throw InputError(fmt::format("block_topk: 'scores' must be [B,S,T,N], got {} dims", s.dim()));
  const int64_t T = s.size(2), bs = p.i("block_size"), NB = (T + bs - 1) / bs;
  if (s.size(3) > NB || (own_counted(p) && s.size(3) != NB))
    throw InputError(fmt::format("block_topk: 'scores' scores {} blocks but T = {} has {} blocks of {}{}", s.size(3), T,
                                 NB, bs, own_counted(p) ? " (own=counted scores every block)" : ""));
}

// The candidates' scores [B,S,T,ceil(T/bs)] in FP64: the block's score, +inf for the own block,
// −inf for every block that is no candidate.
at::Tensor candidate_scores(const at::Tensor& scores, int64_t bs, bool counted) {
  c10::NoGradGuard ng;
  const int64_t B = scores.size(0), S = scores.size(1), T = scores.size(2), N = scores.size(3), NB = (T + bs - 1) / bs;
  at::Tensor s = at::constant_pad_nd(scores.detach().to(at::kCPU, at::kDouble), {0, NB - N}, -kInf);
  auto lo = at::TensorOptions().dtype(at::kLong);
  at::Tensor blk = at::arange(NB, lo).view({1, NB});
  at::Tensor cur = at::div(at::arange(T, lo), bs, "floor").view({T, 1});
  at::Tensor none = counted ? (blk > cur) : (blk >= cur);
  s = s.masked_fill(none.logical_or(blk >= N).view({1, 1, T, NB}), -kInf);
  return s.masked_fill((blk == cur).view({1, 1, T, NB}), kInf).expand({B, S, T, NB}).contiguous();
}

TensorMap reference_fn(const TensorMap& in, const Config& p) {
  check_scores(in, p);
  return {{"block_indices",
           reference::block_topk(in.at("scores"), p.i("block_size"), p.i("topk"), own_counted(p))}};
}

TensorMap cpu_fn(const TensorMap& in, const Config& p) {
  check_scores(in, p);
  return {{"block_indices", block_topk_cpu(in.at("scores"), p.i("block_size"), p.i("topk"), own_counted(p))}};
}

TensorMap scores_fn(const TensorMap& in, const Config& p) {
  check_scores(in, p);
  return {{"block_indices", candidate_scores(in.at("scores"), p.i("block_size"), own_counted(p))}};
}

// Gaussian scores over the blocks the rule scores (complete blocks for appended, every block for
// counted); with ties=1, ReLU of small integers in {−2,…,2}: most scores tie, many at exactly 0 (as
// qsa's ReLU indexer), in every dtype.
TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen) {
  auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t bs = c.i("block_size"), N = own_counted(c) ? (T + bs - 1) / bs : T / bs;
  const std::vector<int64_t> shape = {B, c.i("S"), T, N};
  at::Tensor s = c.b("ties") ? at::relu(at::randint(-2, 3, shape, gen, o)) : at::randn(shape, gen, o);
  return {{"scores", s}};
}

ConfigSpec params_spec() {
  ConfigSpec s;
  s.i("block_size", 4, "keys per block", 1)
      .i("topk", 2, "blocks selected per row (appended: history blocks besides the own block; counted: the own "
                    "block included)", 1)
      .s("own", "appended", "the own block: appended after the topk history blocks (nsa, seer, qsa) or counted among "
                            "them (moba)", {"appended", "counted"})
      .i("S", 2, "selection rows per token (case shape)", 1)
      .b("ties", false, "case scores: ReLU of small integers, most of them tied");
  return s;
}

std::vector<CaseDef> cases() {
  ConfigSpec s = params_spec();
  auto c = [&](const std::string& kv) { return s.parse(kv); };
  return {
      {"T1", c("block_size=4,topk=2"), 1, 1},
      {"appended_B2", c("block_size=4,topk=3"), 2, 37},
      {"appended_topk_gt_blocks", c("block_size=5,topk=16,S=1"), 1, 33},
      {"appended_block1", c("block_size=1,topk=5"), 1, 17},
      {"counted_B2", c("block_size=4,topk=3,own=counted"), 2, 37},
      {"counted_topk1", c("block_size=8,topk=1,own=counted,S=3"), 1, 45},
      {"counted_topk_gt_blocks", c("block_size=5,topk=16,own=counted"), 1, 23},
      {"ties_appended", c("block_size=2,topk=4,S=3,ties=true"), 2, 41},
      {"ties_counted", c("block_size=2,topk=4,S=3,own=counted,ties=true"), 2, 41},
  };
}

OpSpec make_spec() {
  OpSpec s;
  s.name = "block_topk";
  s.family = "sparse";
  s.summary = "block selection of the block-sparse methods: top-k blocks by score per (token, row), the own block "
              "appended (nsa, seer, qsa) or counted (moba), −1 padded";
  s.citation = "MoBA (MoonshotAI/MoBA moba_naive); NSA §3.3.2; SeerAttention; Qwen report §2.1.2 (seed 001)";
  s.params = params_spec();
  s.inputs = {{"scores", false}};
  s.outputs = {"block_indices"};
  s.selection_outputs = {"block_indices"};
  s.selection_scores = scores_fn;
  s.make_inputs = make_inputs;
  s.reference = reference_fn;
  s.cpu = cpu_fn;
  s.cuda = [](const TensorMap& in, const Config& p) {
    check_scores(in, p);
    return TensorMap{{"block_indices", block_topk_fast(in.at("scores"), p.i("block_size"), p.i("topk"), own_counted(p))}};
  };
  s.cases = cases;
  s.check_inputs = check_scores;
  return s;
}

}  // namespace

namespace {

// The selection both paths share, for query rows whose own blocks are `own` [T] (int64, on the
// scores' device); `first(s, k)` returns each row's k best columns, descending score, ties to the
// lower block.
template <class First>
at::Tensor select_blocks_own(const at::Tensor& scores, const at::Tensor& own_blocks, int64_t topk, bool counted, First first) {
  c10::NoGradGuard ng;
  const int64_t B = scores.size(0), S = scores.size(1), T = scores.size(2), N = scores.size(3);
  auto lo = at::TensorOptions().dtype(at::kLong).device(scores.device());
  at::Tensor cur = own_blocks.view({1, 1, T, 1});
  at::Tensor blk = at::arange(N, lo).view({1, 1, 1, N});
  at::Tensor s = scores.detach();
  if (counted) {
    // The own block first (+inf), the future blocks last (−inf, then −1).
    s = s.masked_fill(blk > cur, -kInf).masked_fill(blk == cur, kInf);
    at::Tensor sel = first(s, std::min(topk, N));
    return sel.masked_fill(sel > cur, -1).contiguous();
  }
  at::Tensor own = cur.expand({B, S, T, 1});
  const int64_t n = std::min(topk, N);
  if (n == 0) return own.contiguous();
  s = s.masked_fill(blk >= cur, -kInf);
  at::Tensor sel = first(s, n);
  sel = sel.masked_fill(at::gather(s, 3, sel) == -kInf, -1);
  return at::cat({sel, own}, 3).contiguous();
}

// Query t's own block t / bs.
template <class First>
at::Tensor select_blocks_by(const at::Tensor& scores, int64_t bs, int64_t topk, bool counted, First first) {
  auto lo = at::TensorOptions().dtype(at::kLong).device(scores.device());
  return select_blocks_own(scores, at::div(at::arange(scores.size(2), lo), bs, "floor"), topk, counted, first);
}

}  // namespace

at::Tensor block_topk_cpu(const at::Tensor& scores, int64_t bs, int64_t topk, bool counted) {
  return select_blocks_by(scores, bs, topk, counted, [](const at::Tensor& s, int64_t k) {
    return std::get<1>(at::sort(s, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).slice(3, 0, k);
  });
}

at::Tensor block_topk_keys(const at::Tensor& scores, int64_t bs, int64_t topk, bool counted) {
  if (scores.scalar_type() != at::kFloat) return block_topk_cpu(scores, bs, topk, counted);
  return select_blocks_by(scores, bs, topk, counted, [](const at::Tensor& s, int64_t k) { return topk_lowest_index(s, k); });
}

at::Tensor block_topk_fast(const at::Tensor& scores, int64_t bs, int64_t topk, bool counted) {
  return block_topk_keys(up_to_fp32(scores), bs, topk, counted);
}

at::Tensor block_topk_own(const at::Tensor& scores, const at::Tensor& own, int64_t topk, bool counted) {
  const at::Tensor s = up_to_fp32(scores);
  if (s.scalar_type() != at::kFloat)
    return select_blocks_own(s, own, topk, counted, [](const at::Tensor& x, int64_t k) {
      return std::get<1>(at::sort(x, /*stable=*/true, /*dim=*/-1, /*descending=*/true)).slice(3, 0, k);
    });
  return select_blocks_own(s, own, topk, counted, [](const at::Tensor& x, int64_t k) { return topk_lowest_index(x, k); });
}

MIXBENCH_REGISTER(make_spec());

}  // namespace mixbench
