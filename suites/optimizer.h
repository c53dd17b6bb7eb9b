// nanochat's optimizers and schedules (scripts/base_train.py, nanochat/optim.py): Muon with Polar
// Express and NorMuon variance reduction for the block matrices and per-head stacks of them, AdamW
// groups for embeddings, head, scalars and mixer vectors, each parameter in the group its ParamDef
// declares or, where it leaves that to the trainer, the group resolve_optim_rule gives it
// (docs/optimizer-groups.md).
#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/backbone.h"

namespace mixbench {

// ------------------------------------------------------------------ schedules (scripts/base_train.py)
struct Schedule {
  int64_t steps = 1;
  int64_t warmup = 40;
  double warmdown_ratio = 0.65;
  double final_lr_frac = 0.05;
  int64_t momentum_warmup = 400;
  // Muon's weight decay: nanochat's cosine over the whole run (false), or "warmdown" (true): wd0
  // through warmup and the stable phase, then scaled by the LR multiplier in the warmdown. With
  // "warmdown" every schedule value before the warmdown starts is independent of `steps`, so runs
  // to two budgets are the same run until the shorter one's warmdown (suites/budgets.h).
  bool wd_follows_lr = false;
};
double lr_multiplier(const Schedule& s, int64_t it);
double muon_momentum(const Schedule& s, int64_t it);
// wd0·½(1 + cos(π·it/N)), or with wd_follows_lr wd0 before the warmdown and wd0·lr_multiplier in it
double muon_weight_decay(const Schedule& s, int64_t it, double wd0);
// The first iteration at which schedules a and b give a different LR multiplier, Muon momentum or
// weight decay (min(a.steps, b.steps) when they agree on all iterations both run).
int64_t first_schedule_difference(const Schedule& a, const Schedule& b, double wd0);

// ------------------------------------------------------------------ optimizer pieces (nanochat/optim.py)
// Polar Express orthogonalisation of a 2-D matrix, or of each matrix of a [N, rows, cols] stack (5
// iterations, nanochat's coefficients), after the input is divided by 1.01·‖X‖_F + 1e-6. Computes in
// X's dtype.
at::Tensor polar_express(const at::Tensor& X, int steps = 5);
// One fused AdamW step in place (fp32 math): p *= 1 − lr·wd; m, v lerps; bias-corrected update.
void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, int64_t step,
                  double lr, double beta1, double beta2, double eps, double wd);
// One Muon step in place for a 2-D parameter, or for a [N, rows, cols] stack of same-shape matrices
// (a per-head parameter or same-shape parameters stacked; each matrix its own norms, as if updated alone): Nesterov, row equilibration, Polar Express (bf16 when
// `bf16`), Frobenius renormalisation, NorMuon variance reduction, cautious decay; `lr` is the
// group lr (the max(1, rows/cols)^½ factor is applied here).
void muon_update(at::Tensor& p, const at::Tensor& g, at::Tensor& momentum_buffer, at::Tensor& second_buffer,
                 double momentum, double lr, double wd, double beta2, bool bf16);

// A value that changes from step to step (a schedule's, a bias correction): on the host, or a 0-dim
// tensor on the operands' device in their dtype that the kernels read when they run (a CUDA graph
// replays them with each step's values: the host writes the values into that tensor before).
struct StepScalar {
  double v = 0;
  at::Tensor t;  // defined: the kernels read it
};
// The step-dependent values of one Muon update (one group and matrix shape), derived on the host in
// double exactly as muon_update derives them from momentum, lr and wd.
struct MuonScalars {
  StepScalar one_minus_momentum, momentum;  // 1 − momentum, momentum
  StepScalar lr_eff, lr_eff_wd;             // lr·max(1, rows/cols)^½, and that × wd
};
// Those of one AdamW update: 1 − lr·wd, the second moment's bias correction 1 − β2^t (on a GPU its
// fp32 reciprocal, as LibTorch's CUDA division by a host scalar multiplies by it) and the update's
// factor −lr / (1 − β1^t).
struct AdamScalars {
  StepScalar decay, bias2, step_factor;
  bool bias2_reciprocal = false;  // bias2 holds 1 / (1 − β2^t) (a tensor on a GPU)
};
// muon_update and adamw_update with their step-dependent values given: host values compute exactly
// as those (they are those); tensor values give the same bits (OptimizerDeviceScalars tests).
void muon_update(at::Tensor& p, const at::Tensor& g, at::Tensor& momentum_buffer, at::Tensor& second_buffer,
                 const MuonScalars& s, double beta2, bool bf16);
void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const AdamScalars& s,
                  double beta1, double beta2, double eps);
// The step-dependent values of AdamW step t (≥ 1) at learning rate lr, derived in double as
// adamw_update derives them, in the order of an AdamW slot of a ScalarBuffer: 1 − lr·wd, 1 − β2^t,
// its reciprocal (rounded through fp32 when `single`: LibTorch's CUDA division by a host value
// multiplies by the reciprocal in the operands' opmath type), −lr / (1 − β1^t).
std::array<double, 4> adamw_step_values(double lr, double wd, double beta1, double beta2, int64_t t, bool single);

// The device half of step-dependent values: a small buffer on the parameters' device, in fp64 and
// (the same values rounded) in fp32 for fp32 operands, whose slots the update kernels read when they
// run, so that kernels captured in a CUDA graph once replay with each step's values.
class ScalarBuffer {
 public:
  ScalarBuffer() = default;
  ScalarBuffer(int64_t n, at::Device dev);  // n slots, zero
  bool defined() const { return f64_.defined(); }
  bool is_cuda() const { return f64_.is_cuda(); }
  // Writes v64 into the fp64 buffer and v32 (rounded to fp32) into the fp32 one, both of n values: on
  // a GPU a copy from a fresh pinned host tensor on the current stream, ordered before the kernels
  // that read the buffer (LibTorch's caching host allocator does not hand the host block out again
  // before the copy ran).
  void write(const std::vector<double>& v64, const std::vector<double>& v32);
  // Slot i as a 0-dim tensor of the buffer for operands of `dtype`: fp64 or fp32 (logic_error otherwise).
  StepScalar at(int64_t i, at::ScalarType dtype) const;
  // AdamW's scalars for state of `dtype` from slots [i, i + 4), written from adamw_step_values
  // (single for the fp32 buffer): on a GPU the second moment's bias correction is read as its
  // reciprocal.
  AdamScalars adam(int64_t i, at::ScalarType dtype) const;

 private:
  at::Tensor f64_, f32_;
};

// The rule the trainer applies to a parameter: its ParamDef's rule, or for OptimKind::Auto, by the
// parameter's leaf name (after the last '.') and shape:
//  - a linear map gets muon_rule(): a ParamDef with `matmul` of rank ≥ 2, or a block-level linear map
//    whose FLOPs are not per token (`matmul` false: nsa_cmp_k, nsa_cmp_v, seer_wk); rank ≥ 3 is a
//    stack of [out, in] matrices over its leading (head) dimensions;
//  - anything else a mixer_vector_rule(): A_log, dt_bias, D → Decay; names ending "_bias" or "_b"
//    or starting "b_" → Bias; names containing "norm" → Norm; names ending "_conv" → ConvTaps;
//    the rest → Other.
OptimRule resolve_optim_rule(const ParamDef& def);

struct TrainHyper {
  double batch_tokens_ref = 524288;  // B_ref: AdamW/Muon lrs scale by √(B/B_ref) (nanochat 2^19)
  double muon_wd = 0.28;             // before the cosine schedule (nanochat's scaled value at its horizon)
  bool muon_bf16 = true;             // Polar Express in bf16 (nanochat on bf16 hardware)
  // Muon matrices of one group and shape as one batch (whole parameters and heads of per-head
  // stacks together): always on a GPU; on the CPU only when set (one parameter at a time otherwise)
  bool muon_batch_on_cpu = false;
  Schedule schedule;
};

// Parameter groups and optimizer state over a Model's TensorMap. The groups are the parameters'
// declared rules (ParamDef::optim_rule): parameters with the same group name form one group, whose
// lr is the rule's base lr times the scalings it asks for; two different rules under one group name
// are a logic_error.
class Optimizer {
 public:
  Optimizer(const Model& m, int64_t batch_tokens, const TrainHyper& h);
  // Applies one step with the model's current .grad() values at iteration `it`. With `only`, just
  // those parameters step; the others keep their values and optimizer state (a gate-only stage).
  void step(Model& m, int64_t it, const std::set<std::string>* only = nullptr);

  // Device scalars: from here on every step reads its step-dependent values (learning rates, Muon
  // momentum and weight decay, AdamW's bias corrections) from a small buffer on the parameters'
  // device instead of passing them as host values, so that the kernels of apply() can be captured
  // in a CUDA graph once and replayed at every step. The arithmetic is the host path's, bit for bit.
  void use_device_scalars();
  bool device_scalars() const { return scalars_.defined(); }
  // The host half of a step with device scalars: counts the step (AdamW's t) and writes iteration
  // `it`'s values into the buffer (a copy from a fresh pinned host tensor on the current stream,
  // ordered before the kernels that read it; the host tensor is not reused before the copy ran).
  void write_scalars(int64_t it);
  // The device half: the update kernels, reading the buffer (no host value that changes per step;
  // no host synchronisation). step() is write_scalars(it) then apply() in this mode.
  void apply(Model& m, const std::set<std::string>* only = nullptr);
  // Names of the parameters each group holds ("muon" or the AdamW group name).
  std::string group_of(const std::string& param) const;
  double base_lr(const std::string& param) const;
  // Every parameter with its group and hyper-parameters at the first step: Muon rows give the
  // group lr, the Muon momentum at step 0 (as beta1), NorMuon's beta2, the Muon weight decay
  // before its schedule, the shape of each matrix it orthogonalises, how many, and the lr each
  // gets (lr·max(1, rows/cols)^½); AdamW rows their lr, betas, eps and decoupled weight decay.
  struct ParamSetting {
    std::string param, group, optimizer;
    std::vector<int64_t> shape;
    double lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0;
    double eps = 0;                   // AdamW only
    std::vector<int64_t> matrix;      // Muon only: [rows, cols] of each matrix
    int64_t matrices = 0;             // Muon only: matrices in the parameter (its heads)
    double matrix_lr = 0;             // Muon only
  };
  std::vector<ParamSetting> settings(const Model& m) const;
  TensorMap state() const;                // "<kind>.<param>" tensors + "adam_step"
  void load_state(const TensorMap& t);    // InputError when something is missing or misshaped

 private:
  struct Group {
    std::string name;
    bool muon = false;
    double lr = 0, beta1 = 0, beta2 = 0, wd = 0, eps = 0;
  };
  std::vector<Group> groups_;
  std::map<std::string, size_t> group_index_;  // group name -> groups_ index
  std::map<std::string, size_t> group_of_;     // parameter -> groups_ index
  std::map<std::string, at::Tensor> m1_, m2_;
  int64_t adam_step_ = 0;
  TrainHyper h_;
  // Device scalars: the buffer's slots. [0] 1 − momentum, [1] momentum; per Muon group and matrix
  // shape (muon_slot_) lr_eff, lr_eff·wd; per AdamW group (adam_slot_) 1 − lr·wd, 1 − β2^t, its
  // reciprocal in the buffer's dtype, −lr / (1 − β1^t).
  std::map<std::pair<size_t, std::pair<int64_t, int64_t>>, int64_t> muon_slot_;
  std::map<size_t, int64_t> adam_slot_;
  int64_t n_scalars_ = 0;
  ScalarBuffer scalars_;  // [n_scalars_] on the parameters' device (undefined: host scalars)
  // iteration `it`'s values at the current adam_step_ (single: reciprocals computed in fp32)
  std::vector<double> host_values(int64_t it, bool single) const;
  // The update of every parameter (of `only`): muon(group, rows, cols, p, grad, m1, m2) per Muon
  // parameter or same-shape stack, adam(group, p, grad, m1, m2) per AdamW parameter.
  template <class MuonFn, class AdamFn>
  void update(Model& m, const std::set<std::string>* only, const MuonFn& muon, const AdamFn& adam);
  MuonScalars muon_scalars(size_t group, int64_t rows, int64_t cols, at::ScalarType dtype) const;
  AdamScalars adam_scalars(size_t group, at::ScalarType dtype) const;
};

// Plain AdamW over every parameter of a model (the task suite's): the learning rate of each step
// given by the caller, β1, β2, ε, and decoupled weight decay on parameters of rank ≥ 2 only, fp32
// moments at least. A parameter without a gradient at a step is left as it is (no decay, no moment
// update). Host values by default; with device scalars every step reads its values from a
// ScalarBuffer, so that apply() can be captured in a CUDA graph once and replayed at every step.
class PlainAdamW {
 public:
  PlainAdamW(const Model& m, double beta1, double beta2, double eps, double weight_decay);
  // Step `it` (AdamW's t = it + 1) at learning rate lr with the parameters' current .grad() values:
  // adamw_update with host values, or with device scalars write_scalars(it, lr) then apply(m). The
  // gradients are left as they are.
  void step(Model& m, int64_t it, double lr);
  void use_device_scalars();  // on the device of the parameters (logic_error: none, or several devices)
  bool device_scalars() const { return scalars_.defined(); }
  // The host half of a step with device scalars: step `it`'s values at learning rate lr into the buffer.
  void write_scalars(int64_t it, double lr);
  // The device half: the update kernels, reading the buffer (no host synchronisation).
  void apply(Model& m);

 private:
  double beta1_, beta2_, eps_, wd_;
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> moments_;  // parameter -> (m, v)
  ScalarBuffer scalars_;  // AdamW slots: [0, 4) the decayed parameters' (rank ≥ 2), [4, 8) the others'
};

}  // namespace mixbench
