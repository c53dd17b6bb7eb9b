// The registry: every op (sequence-mixing core on projected tensors) and every method (a full
// token-mixer layer) is declared once, next to its code, by a single registration statement.
// The harness and the suites only ever look things up here; they know no method by name.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>
#include <utility>

#include "harness/accountant.h"
#include "harness/config.h"
#include "harness/param_alias.h"
#include "harness/plan.h"
#include "harness/tensor_map.h"

namespace mixbench {

enum class Backend { Reference, CPU, CUDA };
class ResidualStream;
const char* backend_name(Backend b);

// One conformance case: a configuration and a shape. For methods, `layer` selects which layer of
// the method's (small) model the case builds, so that e.g. both short- and long-window layers of
// `dense` are checked.
struct CaseDef {
  std::string label;
  Config cfg;
  int64_t B = 1, T = 1;
  int64_t layer = 0;
  std::vector<std::string> drop;  // optional inputs left out in this case (e.g. "h0")
};

// Forward of an op: inputs (on the target device/dtype) and params -> named outputs.
using OpFn = std::function<TensorMap(const TensorMap&, const Config&)>;

struct TensorDef {
  std::string name;
  bool differentiable = true;  // gradients are checked for it
  bool optional = false;       // a case may drop it
};

struct OpSpec {
  std::string name, family, summary, citation;
  ConfigSpec params;
  std::vector<TensorDef> inputs;
  std::vector<std::string> outputs;
  // Integer outputs that are selections along their last dimension (e.g. top-k key indices
  // [B,T,k], −1 = empty slot): compared as sets per row (slot order ignored) by compare_selection,
  // reported as checks of kind "selection" with threshold 0, never differentiated.
  std::set<std::string> selection_outputs;
  // Optional: the FP64 reference scores of each selection output's candidates, {output: [..., n]}
  // (rows as the selection's, −inf = not a candidate). With them a selection that differs from the
  // reference's only among keys tied with the k-th score is accepted (tie swaps, conformance_checks.h).
  OpFn selection_scores;
  // Fresh random FP64 inputs (never zeros) for a case: shapes follow from cfg, B and T.
  std::function<TensorMap(const Config&, int64_t B, int64_t T, at::Generator&)> make_inputs;
  OpFn reference;  // FP64 plain loops; differentiable through autograd
  OpFn cpu;        // optimized CPU path (LibTorch)
  OpFn cuda;       // optional CUDA path
  std::function<std::vector<CaseDef>()> cases;
  // Shape and value checks on inputs (InputError naming the problem); golden files go through it.
  std::function<void(const TensorMap&, const Config&)> check_inputs;
  // Extra contract checks beyond ref-vs-optimized (chunked == recurrent, prefill+decode == prefill,
  // ...). Each returns (name, relative error) pairs; the suite applies the dtype threshold.
  std::function<std::vector<std::pair<std::string, double>>(const TensorMap& inputs, const Config&,
                                                            Backend, at::ScalarType)> invariants;
};

// Parameter groups, as nanochat's num_scaling_params splits them.
enum class ParamGroup { TransformerMatrix, Wte, ValueEmbed, LmHead, Scalar };

// How the trainer updates a parameter (nanochat's optimizer table): Muon for block matrices, AdamW
// groups for the rest. Every parameter of a group shares its hyper-parameters (the trainer refuses
// two different rules under one group name); the group name is what reports and checkpoints say.
// docs/optimizer-groups.md gives every group's values and their sources.
enum class OptimKind { Auto, Muon, AdamW };
struct OptimRule {
  // Auto: the trainer decides from the parameter's name and shape (suites/optimizer.h,
  // resolve_optim_rule): Muon for linear maps, a mixer_vector_rule() for the rest.
  OptimKind kind = OptimKind::Auto;
  std::string group;
  double lr = 0;              // base lr before the scalings below and the schedule
  double beta1 = 0, beta2 = 0;  // AdamW's betas; Muon: beta2 of the NorMuon variance buffer
  double wd = 0;              // AdamW decay (Muon's follows the trainer's cosine schedule)
  bool width_scaled = false;  // lr × (d_model/768)^−½
  bool batch_scaled = false;  // lr × √(B/B_ref)
  double eps = 1e-10;         // AdamW's epsilon (nanochat's 1e-10)
  bool operator==(const OptimRule& o) const {
    return kind == o.kind && group == o.group && lr == o.lr && beta1 == o.beta1 && beta2 == o.beta2 && wd == o.wd &&
           width_scaled == o.width_scaled && batch_scaled == o.batch_scaled && eps == o.eps;
  }
  bool operator!=(const OptimRule& o) const { return !(*this == o); }
};
inline OptimRule adamw_rule(std::string group, double lr, double beta1, double beta2, double wd, bool width_scaled,
                            bool batch_scaled, double eps = 1e-10) {
  return {OptimKind::AdamW, std::move(group), lr, beta1, beta2, wd, width_scaled, batch_scaled, eps};
}
// Linear maps: Muon at 0.02·√(B/B_ref), NorMuon β2 0.9 (nanochat). A 2-D parameter is one matrix
// [out, in]; a parameter of rank ≥ 3 is a stack of them [heads…, out, in], each trailing 2-D slice
// orthogonalised as its own matrix.
inline OptimRule muon_rule() { return {OptimKind::Muon, "muon", 0.02, 0, 0.9, 0, false, true}; }
// Mixer parameters that are not linear maps, by what they are to the mixer. nanochat has none; they
// take flash-linear-attention's recipe (flame's AdamW: lr 3e-4 at 2^19 tokens a step, scaled by
// √(B/B_ref), betas (0.9, 0.95), eps 1e-15, decay 0.1) with no decay where FLA marks a parameter
// _no_weight_decay (A_log, dt_bias, D) or where its trainers' grouping skips it (biases, norm gains).
enum class MixerVector { Decay, Bias, Norm, ConvTaps, Other };
inline OptimRule mixer_vector_rule(MixerVector v) {
  switch (v) {
    case MixerVector::Decay: return adamw_rule("mixer_decay", 3e-4, 0.9, 0.95, 0.0, false, true, 1e-15);
    case MixerVector::Bias: return adamw_rule("mixer_bias", 3e-4, 0.9, 0.95, 0.0, false, true, 1e-15);
    case MixerVector::Norm: return adamw_rule("mixer_norm", 3e-4, 0.9, 0.95, 0.0, false, true, 1e-15);
    case MixerVector::ConvTaps: return adamw_rule("mixer_conv", 3e-4, 0.9, 0.95, 0.1, false, true, 1e-15);
    case MixerVector::Other: break;
  }
  return adamw_rule("mixer_vector", 3e-4, 0.9, 0.95, 0.1, false, true, 1e-15);
}

struct ParamDef {
  std::string name;
  std::vector<int64_t> shape;
  ParamGroup group = ParamGroup::TransformerMatrix;
  bool matmul = true;     // participates in a matmul with the token stream (2 FLOPs/param fwd)
  // Initialisation used when training (conformance uses random, non-zero values instead):
  // "uniform" in [init_a, init_b], "normal" N(init_a, init_b), "const" init_a, "ramp" along dim 0
  // from init_a by init_b: element i of L holds init_a + init_b·i/(L−1) (init_a when L = 1),
  // "xavier_normal" N(0, (init_a·√(2/(fan_in + fan_out)))²) for a matrix [fan_out, fan_in]
  // (init_a the Xavier gain).
  std::string init = "uniform";
  double init_a = 0, init_b = 0;
  OptimRule optim = {};   // how training updates it (Auto: the trainer decides, see OptimRule)
  // The input width of a linear map that does not multiply the token stream (matmul false, e.g. a
  // conditioning MLP applied once per row): conformance draws it as randn/√fan_in, as a matmul
  // matrix. 0: the default rule for its group and shape (harness/backbone.h random_param).
  int64_t fan_in = 0;
  // The declared rule (kind Auto when the trainer decides: suites/optimizer.h resolve_optim_rule).
  const OptimRule& optim_rule() const { return optim; }
};

// Where a layer sits in its model: needed for window patterns and value-embedding placement.
struct LayerCtx {
  int64_t layer = 0;
  int64_t n_layer = 1;
  // Training step the layer runs at (the trainer sets it; its evaluations keep the last one);
  // -1 = not training (conformance, sweeps, benchmarks). Methods with a training schedule (the
  // sparse methods' full-attention warm-up) read it.
  int64_t step = -1;
  // Which application of this parameter block the execution plan runs (loops apply a block
  // several times; a plain stack applies each block once: iteration 0 of 1).
  int64_t iteration = 0;
  int64_t n_iterations = 1;
  // The application's position in the unrolled model: its plan step and the plan's step count
  // (the backbone and the accountant set them; n_unrolled = 0: not set, the block's own position).
  // Depth-dependent choices (dense's window pattern, its long last layer) follow the unrolled
  // position, so a shared block applied twice may use two windows; value embeddings stay with
  // the parameter block (`layer`).
  int64_t unrolled = 0;
  int64_t n_unrolled = 0;
  int64_t unrolled_index() const { return n_unrolled > 0 ? unrolled : layer; }
  int64_t unrolled_count() const { return n_unrolled > 0 ? n_unrolled : n_layer; }
};

// One layer of a hybrid's layout: the registered method the layer runs and config overrides
// ("k=v,...") applied on top of the model config for that layer only.
struct LayerChoice {
  std::string method;
  std::string overrides;
};

// What a method needs at a training preset (suites/presets.json names the presets): config
// overrides "k=v,..." applied after the preset's backbone config, and the rows per forward/backward
// where memory needs fewer than the batch (0 = the whole batch).
struct PresetOverride {
  std::string config;
  int64_t micro_batch = 0;
};

struct MethodSpec {
  std::string name, family, summary, citation;
  // The method of its family the leaderboard also compares it with, paired by seed, beside the
  // baseline (a family's control, e.g. the residual streams' single-stream residual; empty: none).
  std::string control;
  // Model-level config: the backbone fields every method shares plus the method's own knobs.
  ConfigSpec config;
  std::vector<std::string> ops;  // ops this method's layer calls
  std::function<std::vector<ParamDef>(const Config&, const LayerCtx&)> params;
  // Non-parameter layer inputs ("x" [B,T,d], "ve" when the layer has a value embedding), FP64.
  std::function<TensorMap(const Config&, const LayerCtx&, int64_t B, int64_t T, at::Generator&)> make_inputs;
  // inputs = layer inputs + parameters by name. Returns at least "y" [B,T,d].
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&)> reference;
  std::function<TensorMap(const TensorMap&, const Config&, const LayerCtx&, Backend)> forward;
  bool has_cuda = false;
  std::function<std::vector<CaseDef>()> cases;
  std::function<LayerCost(const Config&, const LayerCtx&, const CostQuery&)> account;
  // Dimension of this layer's value-embedding table (0 = the layer takes no value embedding).
  std::function<int64_t(const Config&, const LayerCtx&)> ve_dim;
  // Optional incremental decoding (both set or neither). `cache` is the layer's own state:
  // "pos" (int64 scalar on the CPU: tokens consumed so far) plus the method's tensors (attention:
  // K/V of the visible keys, a window keeping only its last `window` keys; linear methods: the
  // recurrent state and the short-conv tail).
  //   prefill: inputs with "x" [B,T,d] (+ "ve") from position 0 -> {"y" [B,T,d]}; fills `cache`
  //   decode:  inputs with "x" [B,1,d] (+ "ve") at position cache["pos"] -> {"y" [B,1,d]}; updates it
  // prefill(T−n) followed by n decode steps must reproduce forward(T) at the last n positions.
  using DecodeFn = std::function<TensorMap(const TensorMap& in, TensorMap& cache, const Config&, const LayerCtx&, Backend)>;
  DecodeFn prefill;
  DecodeFn decode;
  bool has_decode() const { return bool(prefill) && bool(decode); }
  // The hooks also keep static caches (registry: cache_is_static): when the cache map holds
  // "pos_dev" and "capacity" before prefill, every buffer is allocated once for `capacity` tokens
  // (a window's keys in a ring of `window` slots), decode updates them in place and reads its
  // position from the device, so that a CUDA graph can capture the decode step.
  bool static_decode = false;
  // Hybrids (family "hybrid", mixers/hybrid/hybrid.cpp): layer i of an n_layer model runs
  // layout(cfg)[i] (cfg holds n_layer); every function above dispatches to that layer's method
  // with its overrides. Empty for a single mixer.
  std::function<std::vector<LayerChoice>(const Config&)> layout;
  bool is_hybrid() const { return bool(layout); }
  // The model's execution plan (which parameter block runs at each step, harness/plan.h); unset =
  // the plain stack of n_layer blocks. A looped method applies blocks several times.
  std::function<ExecPlan(const Config&)> plan;
  // The residual stream around the sublayers (harness/residual.h); unset = nanochat's.
  std::function<std::shared_ptr<const ResidualStream>(const Config&)> residual;
  // The names other implementations give this layer's parameters, by scheme ("fla":
  // flash-linear-attention's layer the method follows), harness/param_alias.h. Empty: none.
  std::map<std::string, std::function<ParamAliases(const Config&)>> foreign_names;
  // Checked as a whole model rather than one layer: hybrids, looped plans and residual streams.
  bool model_level() const { return is_hybrid() || bool(plan) || bool(residual); }
  // Runs once, after every static registration and before the first lookup (a hybrid builds its
  // config, ops and decode hooks from its components' specs, which may register later).
  std::function<void(MethodSpec&)> complete;
  // Training presets' overrides by preset name. A hybrid adds its components' config overrides
  // (in complete(); its micro-batch stays its own).
  std::map<std::string, PresetOverride> presets;
};

// Position (tokens consumed) recorded in a decode cache; 0 when the cache is empty.
int64_t cache_pos(const TensorMap& cache);
void set_cache_pos(TensorMap& cache, int64_t pos);
// Bytes held by a cache's tensors (the position counters excluded).
int64_t cache_bytes(const TensorMap& cache);
// Static decode caches (MethodSpec::static_decode): the model puts "pos_dev" (int64 [1] on the
// device: the position of the token the next decode step reads, advanced in place by the model)
// and "capacity" (int64 scalar: tokens the buffers hold) into each layer's cache before prefill.
bool cache_is_static(const TensorMap& cache);
int64_t cache_capacity(const TensorMap& cache);
const at::Tensor& cache_pos_dev(const TensorMap& cache);
// Prepares a layer's cache for a new prefill: an eager cache is emptied; a static cache keeps its
// buffers (prefill overwrites them, so a graph captured on them stays valid).
void reset_cache(TensorMap& cache);
// Stores a cache tensor: a static cache copies into the buffer it already holds under `name` (same
// shape: the address a captured graph reads stays valid); otherwise (or the first time) sets it.
void cache_store(TensorMap& cache, const std::string& name, const at::Tensor& t);
// A static decode step's input projection [B, N]: x [B,1,d] times the weight its prefill joined and
// stored as "w.in" (every projection the step applies to the layer's input, in one GEMM). In a fused
// decode step the backbone may form it with the residual stream's update and norm in one launch and
// pass it as in["static_proj"] [B,1,N] (harness/fused_stream.h); this returns that when given.
inline constexpr const char* kStaticInput = "w.in";
inline constexpr const char* kStaticInputProj = "static_proj";
at::Tensor static_input_projection(const TensorMap& in, const TensorMap& cache);

class Registry {
 public:
  static Registry& get();
  bool add(OpSpec spec);
  bool add(MethodSpec spec);
  const OpSpec& op(const std::string& name) const;          // UsageError with suggestions
  const MethodSpec& method(const std::string& name) const;  // UsageError with suggestions
  bool has_op(const std::string& name) const { return ops_.count(name) > 0; }
  bool has_method(const std::string& name) const { return methods_.count(name) > 0; }
  std::vector<const OpSpec*> ops() const;
  std::vector<const MethodSpec*> methods() const;

 private:
  void complete_methods() const;  // runs MethodSpec::complete hooks once
  std::map<std::string, OpSpec> ops_;
  mutable std::map<std::string, MethodSpec> methods_;
  mutable bool completed_ = false;
};

// A catalogue name kept out of the registry (e.g. a method with no public definition to
// implement): `mixbench list --all` shows it with the reason. Register with
// MIXBENCH_REGISTER_UNLISTED({name, family, reason}).
struct UnlistedMethod {
  std::string name, family, reason;
};
bool add_unlisted_method(UnlistedMethod m);
const std::vector<UnlistedMethod>& unlisted_methods();  // in name order

// Closest names by edit distance, for "did you mean" messages.
std::vector<std::string> closest_names(const std::string& name, const std::vector<std::string>& known,
                                       size_t max_results = 3);

// Call a registered op through the given backend, inside an NVTX range "<method>/<op>/forward".
TensorMap call_op(const std::string& op, Backend backend, const TensorMap& inputs, const Config& params);

// Optimized paths name the kernel or library backend that actually ran (e.g. "sdpa", "flash");
// the suites copy it into each result so reports say which backend produced the numbers.
void note_kernel(const std::string& name);
std::string take_kernel_notes();  // comma-joined, distinct, in order; clears

// The method whose layer is running on this thread (names NVTX ranges); set by the suites.
struct ScopedMethod {
  explicit ScopedMethod(const std::string& name);
  ~ScopedMethod();
  static const std::string& current();
 private:
  std::string prev_;
};

}  // namespace mixbench

#define MIXBENCH_CONCAT_(a, b) a##b
#define MIXBENCH_CONCAT(a, b) MIXBENCH_CONCAT_(a, b)
// Register an op or method: MIXBENCH_REGISTER(make_spec()); where make_spec returns OpSpec/MethodSpec.
#define MIXBENCH_REGISTER(expr) \
  static const bool MIXBENCH_CONCAT(mixbench_registered_, __LINE__) = ::mixbench::Registry::get().add(expr)
#define MIXBENCH_REGISTER_UNLISTED(...) \
  static const bool MIXBENCH_CONCAT(mixbench_unlisted_, __LINE__) = ::mixbench::add_unlisted_method(__VA_ARGS__)
