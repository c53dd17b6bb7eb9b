// The residual stream around a model's sublayers. The backbone asks the stream for each
// sublayer's input (it applies the sublayer's RMSNorm to what `read` returns), hands the
// sublayer's output to `write`, and takes the hidden state before the final norm from `finish`.
// The stream owns the residual update and its parameters; nanochat's resid_lambdas / x0_lambdas /
// backout stream is the default (`nanochat_stream()`). Variants (hyper-connections, attention
// residuals, …) implement this interface and a method selects one with MethodSpec::residual.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "harness/plan.h"
#include "harness/registry.h"
#include "harness/tensor_map.h"

namespace mixbench {

struct ModelDims;

// One sublayer of the forward pass: the mixer or the MLP of plan step `step`.
struct Sublayer {
  enum class Kind { Mixer, Mlp };
  int64_t step = 0;     // plan step, counted within its route (ExecPlan::route_pos)
  int64_t n_steps = 1;  // steps in the route (the plan's, without auxiliary routes)
  int64_t block = 0;    // the step's parameter block
  Kind kind = Kind::Mixer;
  int64_t iteration = 0;           // which application of the block (PlanStep::iteration)
  int64_t n_iterations = 1;        // how many times the plan applies it
  Backend backend = Backend::CPU;  // Reference: the stream's FP64 reference arithmetic
  int64_t pos = 0;                 // position of the pass's first token (decode: tokens already consumed)
  int64_t train_step = -1;         // Model::step: the training step (-1 = not training)
  uint64_t seed = 0;               // Model::seed: the run's seed (streams that sample draw from it)
  int64_t row0 = 0;                // Model::row0: global batch index of the pass's first row
  int64_t route = 0;               // the step's plan route (0: the model's; > 0 an auxiliary one, harness/plan.h)
  int64_t index() const { return 2 * step + (kind == Kind::Mlp ? 1 : 0); }  // depth in sublayers
};

class ResidualStream {
 public:
  virtual ~ResidualStream() = default;
  virtual std::string name() const = 0;
  // Parameters the stream owns (full names, with their group, optimizer rule and init).
  virtual std::vector<ParamDef> params(const ModelDims& d, const ExecPlan& plan) const = 0;
  // The stream's state for one pass, started from the smeared, normalized embedding x [B,T,d].
  // `backend` is the pass's backend: Backend::Reference asks for the stream's reference arithmetic
  // (written independently of the fast path), the others for the fast path.
  virtual TensorMap begin(const at::Tensor& x, const TensorMap& params, Backend backend) const = 0;
  // The input of sublayer `s` before its RMSNorm ([B,T,d]).
  virtual at::Tensor read(TensorMap& state, const Sublayer& s, const TensorMap& params) const = 0;
  // What sublayer `s` reads: its input after the RMSNorm (`normed`, [B,T,d]). A stream may modulate
  // it (e.g. a per-channel scale from a conditioning vector, adaLN); the default returns it.
  virtual at::Tensor modulate(TensorMap& state, const Sublayer& s, const at::Tensor& normed,
                              const TensorMap& params) const {
    return normed;
  }
  // Takes the sublayer's output y [B,T,d].
  virtual void write(TensorMap& state, const Sublayer& s, const at::Tensor& y, const TensorMap& params) const = 0;
  // The hidden state before the final norm ([B,T,d]). A scalar "aux_loss" left in the state (e.g.
  // a ponder cost) is added to the model's auxiliary loss.
  virtual at::Tensor finish(TensorMap& state, const TensorMap& params, Backend backend) const = 0;
  // Whether sublayer `s` runs in this pass (a sampled loop depth shorter than the plan skips the
  // plan's later applications): when false the backbone leaves the state and the step's cache slot
  // untouched. Both sublayers of a step must agree.
  virtual bool runs(const Sublayer& s, const TensorMap& state) const { return true; }
  // Whether a decode step through this stream is the same work at every position with no host-side
  // reads (no Sublayer::pos, no data-dependent skips): static decode caches and a captured decode
  // step need it. Off unless a stream says so. A decode step over static caches finds the token's
  // position on the device in its state as "pos_dev" (int64 [1], ModelCache::pos_dev): a stream
  // that needs the position reads it there instead of Sublayer::pos.
  virtual bool static_decode() const { return false; }
  // Whether sublayer `s` runs without gradient (truncated backpropagation through early loop
  // applications): the backbone runs its read, layer and write under a no-grad scope.
  virtual bool truncated(const Sublayer& s, const TensorMap& state) const { return false; }
  // The expected share of training passes that run plan step `step` (a sampled loop depth skips
  // later applications): the accountant weighs the step's costs by it. 1 = always runs.
  virtual double step_share(const ExecPlan& plan, int64_t step) const { return 1.0; }
  // Forward FLOPs per token of the stream's own arithmetic on the model's route that the accountant
  // adds (the default stream's scalar mixes are not counted, as nanochat does not count them).
  // d.seq_len is the pass's tokens per row: the accountant asks at the query's T for a forward
  // pass and at 1 for a decode step (a cost paid once per row, e.g. a conditioning vector, is that
  // cost over d.seq_len per token).
  virtual double fwd_flops(const ModelDims& d, const ExecPlan& plan) const { return 0; }
  // The part of fwd_flops done element-wise (norms, gates, normalisations), which the FLOP audit's
  // dispatcher-level counter cannot see; the audit adds it back (LayerCost::uncounted_flops).
  virtual double uncounted_flops(const ModelDims& d, const ExecPlan& plan) const { return 0; }
  // The same two numbers for the plan's auxiliary routes (their steps' read-outs included), which
  // only a pass collecting auxiliary losses runs: the accountant bills them to training.
  virtual double aux_fwd_flops(const ModelDims& d, const ExecPlan& plan) const { return 0; }
  virtual double aux_uncounted_flops(const ModelDims& d, const ExecPlan& plan) const { return 0; }
  // Training activation bytes per token the stream keeps beyond the backbone's one [d] state per
  // step boundary (e.g. n parallel streams, block sums); `dtype_bytes` is the compute dtype's size.
  virtual double act_bytes(const ModelDims& d, const ExecPlan& plan, int64_t dtype_bytes) const { return 0; }
  // May change the training initialisation of the model's parameters (every definition of the
  // model, blocks and backbone alike), e.g. depth-dependent init gains; the default keeps them.
  virtual void adjust_init(std::vector<ParamDef>& defs, const ModelDims& d, const ExecPlan& plan) const {}

  // ---- several exits (ouro reads the model out after every loop) ----
  // After finish() the backbone asks for the pass's exits: their hidden states before the final
  // norm (finish() returned the last one's), their exit distribution and the exit each token
  // takes outside training. The backbone computes every exit's logits (final norm, lm_head,
  // softcap), returns the chosen exit's per token and keeps them all for the training loss.
  // The default: no `hidden`, one exit (finish()'s).
  struct Exits {
    std::vector<at::Tensor> hidden;  // K × [B,T,d]
    at::Tensor gates;                // [B,T,K] the gates' exit probabilities λ (the last exit ignores its own)
    at::Tensor probs;                // [B,T,K] the exit distribution (Σ over K = 1)
    at::Tensor choice;               // [B,T] int64: the exit each token takes outside training
  };
  virtual Exits exits(TensorMap& state, const TensorMap& params, Backend backend) const { return {}; }
  // The training loss of a stream with several exits from the exits' per-token cross-entropies
  // ce [K,B,T] and the mask of the counted tokens [B,T]: `loss` to minimise, `lm` the expected
  // cross-entropy (the logged training loss), `aux` the rest. `gate_only`: the run's final stage,
  // which trains only gate_params().
  struct ExitLoss {
    at::Tensor loss, lm, aux;
  };
  virtual ExitLoss exit_loss(const Exits& e, const at::Tensor& ce, const at::Tensor& valid, bool gate_only,
                             Backend backend) const;
  // The exit-gate parameters a final gate-only stage of a training run trains alone (the others
  // keep their values and optimizer state); empty: the run has no such stage.
  virtual std::vector<std::string> gate_params() const { return {}; }
  // May change the inputs of sublayer `s`'s mixer after the backbone built them ("x", "ve", the
  // block's parameters), e.g. a stream that runs a step on a subset of the tokens gathers their
  // value embeddings and adds their positions ("positions" [B,T'] int64). The default keeps them.
  virtual void mixer_inputs(const TensorMap& state, const Sublayer& s, TensorMap& in) const {}
};

// nanochat's stream: before step i's mixer x ← resid_lambdas[i]·x + x0_lambdas[i]·x0 (x0 the
// embedding); each sublayer adds its output; the state after step n_steps/2 is kept and
// backout_lambda times it is subtracted at the end. resid_lambdas / x0_lambdas have one entry per
// plan step.
std::shared_ptr<const ResidualStream> nanochat_stream();
// The same stream keeping the state after plan step `backout_step` for the backout (looped
// models whose backout reads the prelude's last layer); a negative step is the default midpoint.
std::shared_ptr<const ResidualStream> nanochat_stream(int64_t backout_step);

}  // namespace mixbench
