// LoopFormer (arXiv 2602.11451; armenjeddi/loopformer models/loopformer.py, train.py, utils.py) as
// the plan and residual stream of `loopformer_fixed2`. The pieces are exposed for tests; each has
// an FP64 reference twin written position by position or channel by channel (the `ref_` ones).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "harness/plan.h"
#include "harness/registry.h"
#include "harness/tensor_map.h"

namespace mixbench::loopformer {

constexpr int64_t kFreqDim = 256;          // TimestepEmbedder's frequency_embedding_size
constexpr double kMaxPeriod = 10000.0;     // its max_period
constexpr double kShortCeWeight = 0.1;     // train.py: loss_ntp = loss1 + 0.1·loss2 (the short route's CE)
constexpr double kConsistencyWeight = 0.1; // train.py: loss = loss_ntp + 0.1·mse(x1.detach(), x2)
constexpr double kProjInitStd = 0.02;      // the output projections' N(0, 0.02/√(2·n_layer)) (GPT-2's rule)

// The layout of a model: `prelude` blocks once, the `core` blocks `loops` times (the looped,
// conditioned stack), `coda` blocks once. The model's route runs the full schedule: loop k at
// t = k/loops with Δt = 1/loops. With loops ≥ 2 a shorter schedule exists and the plan adds it as
// auxiliary route 1: the core once at t = 0, Δt = 1 (between the same prelude and coda).
struct Layout {
  int64_t prelude = 0, core = 1, coda = 0, loops = 2;
  bool has_short() const { return loops >= 2; }
  int64_t long_steps() const { return prelude + core * loops + coda; }
  int64_t short_steps() const { return prelude + core + coda; }
  bool is_core(int64_t block) const { return block >= prelude && block < prelude + core; }
  // the loop of a core step (`step` counted within its route) and the schedule of a route's loop
  int64_t loop_of(int64_t step) const { return (step - prelude) / core; }
  double t_of(int64_t route, int64_t loop) const { return route == 0 ? double(loop) / double(loops) : 0.0; }
  double dt_of(int64_t route) const { return route == 0 ? 1.0 / double(loops) : 1.0; }
};
// The model's route (ExecPlan::loop) and, when it exists, the short route.
ExecPlan plan(const Layout& l);
Layout layout_of(const Config& c);

// The conditioning parameters (all matmul = false: they act once per row, not per token):
//   loopformer_{t,dt}_w1 [d, 256], _b1 [d], _w2 [d, d], _b2 [d]  the two TimestepEmbedders
//   loopformer_ada_w [core, 4d, d], loopformer_ada_b [core, 4d]   one adaLN map per core block
std::vector<ParamDef> params(const Layout& l, int64_t d_model);

// TimestepEmbedder.timestep_embedding: [cos(t·f_i), sin(t·f_i)], f_i = exp(−ln(10000)·i/128),
// i = 0 … 127, for `rows` rows of the same t: [rows, 256] in `opts`.
at::Tensor frequency_embedding(double t, int64_t rows, const at::TensorOptions& opts);
at::Tensor ref_frequency_embedding(double t, int64_t rows, const at::TensorOptions& opts);
// c = te(t) + dte(Δt), each embedder Linear(256, d) → SiLU → Linear(d, d): [rows, d].
at::Tensor condition(const TensorMap& P, double t, double dt, int64_t rows, const at::TensorOptions& opts);
at::Tensor ref_condition(const TensorMap& P, double t, double dt, int64_t rows, const at::TensorOptions& opts);
// adaLN of core block j: SiLU(c)·Wⱼᵀ + bⱼ → [rows, 4d], chunks (gate_msa, gate_mlp, scale_msa, scale_mlp).
at::Tensor modulation(const TensorMap& P, int64_t j, const at::Tensor& c);
at::Tensor ref_modulation(const TensorMap& P, int64_t j, const at::Tensor& c);
// The shortcut-consistency term: kConsistencyWeight · mean over B·T·d of
// (stopgrad(norm(h_long)) − norm(h_short))², norm the final RMSNorm (the head's, no weight).
at::Tensor consistency_loss(const at::Tensor& h_long, const at::Tensor& h_short);
at::Tensor ref_consistency_loss(const at::Tensor& h_long, const at::Tensor& h_short);

}  // namespace mixbench::loopformer
