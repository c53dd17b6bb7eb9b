// Training: a training loop with validation bits per byte, atomic checkpoints and exact resume. The
// headers it includes hold the rest of training: nanochat's optimizers and schedules
// (suites/optimizer.h), byte-level data (suites/train_data.h), the presets (suites/train_presets.h)
// and the equal-FLOP leaderboard (suites/leaderboard.h).
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/backbone.h"
#include "harness/safetensors.h"
#include "suites/leaderboard.h"
#include "suites/mfu.h"
#include "suites/optimizer.h"
#include "suites/train_data.h"
#include "suites/train_presets.h"

namespace mixbench {

class DataParallel;  // suites/distributed.h
// A run's state between two steps: parameters, optimizer state, data cursor, generator and
// history, as its checkpoint file holds them.
using RunSnapshot = SafetensorsFile;

struct TrainOptions {
  std::string method;
  std::string preset = "tiny";
  std::string config;          // extra "k=v,..." for the method's config
  int64_t steps = 0;           // 0 = from the budget (suites/budgets.h)
  std::string budget;          // "tpp=X", "flops=Y" or "steps=N"; "" = the preset's
  std::optional<std::string> anchor_config;  // overrides of the anchor a budget is computed at; none = `config`
  int64_t batch = 0;           // rows per step; 0 = the preset's
  int64_t micro_batch = 0;     // rows per forward/backward (gradients accumulated over the step's
                               // rows, the same update); 0 = the preset's for the method, else all
  uint64_t seed = 0;
  std::string data;            // "synthetic", "text" (the built-in corpus) or a path; "" = the preset's
  std::string out;             // folder for checkpoint and report ("" = none)
  bool resume = false;
  // Parameters to start from instead of the initialisation (suites/checkpoint_in.h): a model state
  // dict (init_level "model": nanochat's or mixbench's names) or one layer's (init_level "layer":
  // fla's or nanochat's names, loaded into the blocks init_layers, all when empty).
  std::string init_from;
  std::string init_level = "model";
  std::vector<int64_t> init_layers;
  int64_t eval_every = 0;      // 0 = the preset's
  int64_t eval_batches = 0;    // 0 = the preset's
  // batches of the final evaluation (the run's val_bpb): −1 = the whole validation stream, 0 = eval_batches,
  // N; unset = the preset's final_eval_batches
  std::optional<int64_t> final_eval_batches;
  int64_t checkpoint_every = 0;  // 0 = the preset's
  int64_t stop_after = 0;      // stop (as if interrupted) after this many steps; 0 = never
  int progress = 0;            // 0 = none, 1 = JSON lines, 2 = human lines
  int64_t probe_sequences = -1;  // held-out sequences per probe after training; -1 = the preset's, 0 = none
  std::string device = "cpu";  // "cpu" or "cuda" (parameters initialised on the CPU, then moved)
  std::string dtype;           // compute dtype: "bf16" or "fp32" ("" = bf16 on a GPU, fp32 on the CPU); the
                               // parameters and the optimizer state stay fp32 (bf16 copies are the compute weights)
  std::string trace;           // Kineto trace of `trace_steps` steps after the first ("" = none): a Chrome
  int64_t trace_steps = 2;     // trace file, and its kernel-time summary in the report (suites/step_trace.h)
  std::string graph = "auto";  // CUDA graphs on a GPU: "auto" the whole step (forward, backward and optimizer)
                               // where it can be captured, else forward + backward; "fwd-bwd" forward +
                               // backward only (the optimizer eager, with host scalars); "off" none
  int64_t log_every = 0;       // steps between loss read-backs and progress lines (0 = the preset's); a
                               // read-back synchronises the host with the device, so GPU presets log sparsely
  // Several ranks (suites/distributed.h): each trains its share of every step's rows on GPU LOCAL_RANK
  // (or the CPU) and the gradients are summed; rank 0 evaluates and saves. Null: one process.
  std::shared_ptr<DataParallel> data_parallel;
  // Branching (suites/budgets.h): start from a snapshot instead of step 0 (of a run that agrees with
  // this one on everything but its length), and/or stop after step `snapshot_at` keeping the state
  // in *snapshot_out (no probes then).
  const RunSnapshot* start_from = nullptr;
  int64_t snapshot_at = 0;
  RunSnapshot* snapshot_out = nullptr;
};

struct TrainResult {
  std::string method;
  Config cfg;
  std::vector<double> losses;  // training LM loss per step (nats/token; the auxiliary losses excluded)
  std::vector<double> aux_losses;  // Σ layers' auxiliary losses per step (empty: the method has none)
  std::vector<std::pair<int64_t, double>> val_curve;  // (step, val bpb)
  double val_bpb = 0;          // the final evaluation (bits per token when not byte-level)
  int64_t val_tokens = 0;      // target positions that evaluation scored (BOS targets excluded from bpb)
  bool byte_level = true;
  int64_t steps_done = 0, tokens = 0;
  int64_t batch = 0, micro_batch = 0;  // rows per step; rows per forward/backward
  double seconds = 0, tokens_per_s = 0;  // tokens_per_s: steady rate, the first step of the process excluded
  double first_step_s = 0;     // the first step of the process (allocator, cuBLAS and kernel warm-up)
  // Where this process's time went (a resumed run's earlier processes not included): setup (the data,
  // the model, the optimizer, a resumed checkpoint: all before the first step), steps (the training
  // steps, as `seconds` times them), eval (the validation curve and the final evaluation), checkpoint
  // (the saves) and total (the whole of run_train, the probes and the rest included).
  struct PhaseSeconds {
    double setup = 0, steps = 0, eval = 0, checkpoint = 0, total = 0;
  } phase_seconds;
  std::string dtype = "fp32";  // compute dtype
  double mfu = 0;              // train FLOPs/token (nanochat convention) × tokens_per_s ÷ peak.flop_per_s
  MatmulPeak peak;
  bool graph = false;          // the steps after the first replayed a CUDA graph
  std::string graph_scope = "none";  // what it holds: "step" (forward, backward and optimizer),
                                     // "forward_backward" (the optimizer eager) or "none" (no graph)
  std::string graph_reason;    // why the scope is less than "step" (empty when it is "step")
  bool eval_graph = false;     // the validation forward replayed a CUDA graph (after its first batch)
  std::string eval_graph_reason;  // why it did not (empty when it did)
  nlohmann::json trace;        // the traced steps' kernel-time summary (null without --trace)
  // The run's peak memory (the report's `memory`: the CUDA caching allocator's peak on a GPU, the
  // process's resident peak on the CPU) over its steps and evaluations, the model and optimizer
  // state it holds from setup included; what a scheduler of several runs on one device needs.
  nlohmann::json memory;
  ModelCost cost;
  nlohmann::json probes;       // {probe: {accuracy, exact, chance, sequences, answers}} (byte-level data)
  std::string device = "cpu";
  int threads = 0;             // intra-op threads the run used on the CPU (0 on a GPU)
  int world_size = 1;          // ranks that trained data-parallel
  std::string backend = "none";  // their c10d backend: "gloo", "nccl" ("none": one process)
  BudgetPlan budget;           // what set the run's length
};

TrainResult run_train(const TrainOptions& opt);
// The first step of a run's final exit-gate-only stage (a method whose residual stream has exit
// gates, ResidualStream::gate_params; ouro): `steps` minus the method's gate_stage_steps, or minus
// llround(preset gate_stage_frac · steps) when that is −1; `steps` for a method without exit
// gates. UsageError when the stage would cover the whole run.
int64_t gate_stage_start(const MethodSpec& m, const Config& cfg, const TrainPreset& p, int64_t steps);
// The run's parameters with their optimizer groups and hyper-parameters at the first step (what
// `mixbench train --dry-run` prints): {method, preset, config, batch_tokens, steps, params: [{param,
// shape, group, optimizer, lr, beta1, beta2, eps, weight_decay}]}; eps is null on Muon rows, which
// add matrix ([rows, cols] of each matrix), matrices (how many: a per-head stack's heads) and
// matrix_lr (lr·max(1, rows/cols)^½). Builds the model on the CPU; trains nothing.
nlohmann::json optimizer_settings(const TrainOptions& opt);
nlohmann::json train_result_json(const TrainResult& r);

}  // namespace mixbench
