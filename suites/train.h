// Training: nanochat's optimizers (Muon with Polar Express and NorMuon variance reduction for the
// block matrices, AdamW groups for embeddings, head and scalars) and schedules, byte-level data
// (a seeded synthetic stream, UTF-8 text files, modded-nanogpt .bin shards), a training loop with
// validation bits per byte, atomic checkpoints and exact resume, and the equal-FLOP leaderboard.
#pragma once
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
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
};
double lr_multiplier(const Schedule& s, int64_t it);
double muon_momentum(const Schedule& s, int64_t it);
double muon_weight_decay(const Schedule& s, int64_t it, double wd0);  // wd0·½(1 + cos(π·it/N))

// ------------------------------------------------------------------ optimizer pieces (nanochat/optim.py)
// Polar Express orthogonalisation of a 2-D matrix (5 iterations, nanochat's coefficients), after
// the input is divided by 1.01·‖X‖_F + 1e-6. Computes in X's dtype.
at::Tensor polar_express(const at::Tensor& X, int steps = 5);
// One fused AdamW step in place (fp32 math): p *= 1 − lr·wd; m, v lerps; bias-corrected update.
void adamw_update(at::Tensor& p, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, int64_t step,
                  double lr, double beta1, double beta2, double eps, double wd);
// One Muon step in place for a 2-D parameter: Nesterov, row equilibration, Polar Express (bf16 when
// `bf16`), Frobenius renormalisation, NorMuon variance reduction, cautious decay; `lr` is the
// group lr (the max(1, rows/cols)^½ factor is applied here).
void muon_update(at::Tensor& p, const at::Tensor& g, at::Tensor& momentum_buffer, at::Tensor& second_buffer,
                 double momentum, double lr, double wd, double beta2, bool bf16);

struct TrainHyper {
  double batch_tokens_ref = 524288;  // B_ref: AdamW/Muon lrs scale by √(B/B_ref) (nanochat 2^19)
  double muon_wd = 0.28;             // before the cosine schedule (nanochat's scaled value at its horizon)
  bool muon_bf16 = true;             // Polar Express in bf16 (nanochat on bf16 hardware)
  Schedule schedule;
};

// Parameter groups and optimizer state over a Model's TensorMap. The groups are the parameters'
// declared rules (ParamDef::optim_rule): parameters with the same group name form one group, whose
// lr is the rule's base lr times the scalings it asks for; two different rules under one group name
// are a logic_error.
class Optimizer {
 public:
  Optimizer(const Model& m, int64_t batch_tokens, const TrainHyper& h);
  // Applies one step with the model's current .grad() values at iteration `it`.
  void step(Model& m, int64_t it);
  // Names of the parameters each group holds ("muon" or the AdamW group name).
  std::string group_of(const std::string& param) const;
  double base_lr(const std::string& param) const;
  TensorMap state() const;                // "<kind>.<param>" tensors + "adam_step"
  void load_state(const TensorMap& t);    // InputError when something is missing or misshaped

 private:
  struct Group {
    std::string name;
    bool muon = false;
    double lr = 0, beta1 = 0, beta2 = 0, wd = 0;
  };
  std::vector<Group> groups_;
  std::map<std::string, size_t> group_index_;  // group name -> groups_ index
  std::map<std::string, size_t> group_of_;     // parameter -> groups_ index
  std::map<std::string, at::Tensor> m1_, m2_;
  int64_t adam_step_ = 0;
  TrainHyper h_;
};

// ------------------------------------------------------------------ data
constexpr int64_t kByteBos = 256;  // byte-level tokenizer: bytes 0..255 and BOS = 256 (vocab 257)

struct Corpus {
  at::Tensor train, val;      // 1-D int64 token streams
  bool byte_level = true;     // tokens are bytes (bpb exact: 1 byte per token, 0 for BOS)
  int64_t bos = kByteBos;
  int64_t max_token = 0;
  std::string source, hash;   // description, FNV hash of the source description/content
};
// Seeded synthetic byte stream: BOS-prefixed documents of key=value facts, filler words, queries
// that recall earlier facts and verbatim copies of earlier spans (long-range structure). With
// probe_T > 0 every second document is instead a capability probe (suites/train_eval.h) of the
// suite for length probe_T, kinds in turn, drawn from the run seed's stream (the held-out probes
// use another).
Corpus synthetic_corpus(uint64_t seed, int64_t train_bytes, int64_t val_bytes, int64_t probe_T = 0);
std::string synthetic_document(uint64_t seed, int64_t index);  // one document (bytes, no BOS)
// UTF-8 text file or folder (files in sorted path order), each document BOS-prefixed; the last
// tenth of the stream is held out for validation.
Corpus text_corpus(const std::string& path);
// modded-nanogpt .bin shard(s); InputError on a bad magic/version or a truncated file.
at::Tensor read_bin_shard(const std::string& path);
Corpus bin_corpus(const std::string& path);
// "synthetic" (with probes for length probe_T, 0 = none; at least train_tokens long so that a
// run reads no byte twice) or a path
Corpus load_corpus(const std::string& data, uint64_t seed, int64_t probe_T = 0, int64_t train_tokens = 0);

// Rows of T+1 tokens starting at stream offset `pos` (wrapping): inputs [B,T], targets [B,T].
void get_batch(const at::Tensor& stream, int64_t pos, int64_t B, int64_t T, at::Tensor& x, at::Tensor& y);

// ------------------------------------------------------------------ training
struct TrainOptions {
  std::string method;
  std::string preset = "tiny";
  std::string config;          // extra "k=v,..." for the method's config
  int64_t steps = 0;           // 0 = the preset's
  int64_t batch = 0;           // rows per step; 0 = the preset's
  int64_t micro_batch = 0;     // rows per forward/backward (gradients accumulated over the step's
                               // rows, the same update); 0 = the preset's for the method, else all
  uint64_t seed = 0;
  std::string data = "synthetic";
  std::string out;             // folder for checkpoint and report ("" = none)
  bool resume = false;
  int64_t eval_every = 0;      // 0 = the preset's
  int64_t eval_batches = 0;    // 0 = the preset's
  int64_t checkpoint_every = 0;  // 0 = the preset's
  int64_t stop_after = 0;      // stop (as if interrupted) after this many steps; 0 = never
  int progress = 0;            // 0 = none, 1 = JSON lines, 2 = human lines
  int64_t probe_sequences = -1;  // held-out sequences per probe after training; -1 = the preset's, 0 = none
  std::string device = "cpu";  // "cpu" or "cuda" (parameters initialised on the CPU, then moved)
};

struct TrainResult {
  std::string method;
  Config cfg;
  std::vector<double> losses;  // training LM loss per step (nats/token; the auxiliary losses excluded)
  std::vector<double> aux_losses;  // Σ layers' auxiliary losses per step (empty: the method has none)
  std::vector<std::pair<int64_t, double>> val_curve;  // (step, val bpb)
  double val_bpb = 0;          // at the last evaluation (bits per token when not byte-level)
  bool byte_level = true;
  int64_t steps_done = 0, tokens = 0;
  int64_t batch = 0, micro_batch = 0;  // rows per step; rows per forward/backward
  double seconds = 0, tokens_per_s = 0;
  ModelCost cost;
  nlohmann::json probes;       // {probe: {accuracy, exact, chance, sequences, answers}} (byte-level data)
  std::string device = "cpu";
  int threads = 0;             // intra-op threads the run used on the CPU (0 on a GPU)
};

// Preset configuration, as declared in suites/presets.json: "tiny" (the CPU: 6 methods in about 10
// minutes on 2 cores) and "small" (one GPU: every registered method in about 5 minutes), with the
// per-method overrides the methods declare where they are registered (MethodSpec::presets).
// UsageError for unknown names.
struct TrainPreset {
  std::string name;
  std::string config;  // backbone overrides
  int64_t steps, batch, eval_every, eval_batches, checkpoint_every;
  int64_t probe_sequences = 64;  // held-out sequences per probe kind after training
  int cpu_threads = 0;            // intra-op threads on the CPU during the run (0 = LibTorch's default)
  std::map<std::string, std::string> method_config;  // per-method overrides after `config`
  std::map<std::string, int64_t> method_micro_batch;  // rows per forward/backward where memory needs it
  TrainHyper hyper;
  std::string anchor;     // the leaderboard's FLOP anchor: every method is calibrated to its FLOPs/token
  std::string baseline;   // the leaderboard's reference for the paired difference ("delta_vs_<baseline>")
  std::vector<std::string> lineup;  // the leaderboard's default methods; empty = every registered method
  std::string config_for(const std::string& method) const;
};
TrainPreset train_preset(const std::string& name);
// suites/presets.json, embedded at build time: {preset: {field: value}} in declaration order.
const nlohmann::ordered_json& train_presets_table();

TrainResult run_train(const TrainOptions& opt);
nlohmann::json train_result_json(const TrainResult& r);

// ------------------------------------------------------------------ leaderboard
struct Calibration {
  std::string method;
  int64_t n_layer = 0, d_model = 0;
  int64_t mlp_hidden = 0;                              // 0: nanochat's 4·d_model
  double flops = 0, anchor_flops = 0, residual = 0;  // residual = flops/anchor − 1
  bool within = false;                                 // |residual| ≤ 2%
  std::string config;                                  // overrides that realise the shape
};
// Picks n_layer/d_model from the grid (n_layer 1..2L, d_model multiples of head_dim up to 2d) and
// the MLP width (nanochat's 4·d_model, or a multiple of head_dim in [2d, 6d]) whose training
// FLOPs/token (nanochat convention) is within ±2% of the preset's anchor's (TrainPreset::anchor), nearest
// the anchor's shape: |ΔL| + |Δd|/head_dim + |mlp − 4d|/(4·head_dim); ties to the smaller residual.
Calibration calibrate(const std::string& method, const std::string& preset, const std::string& extra_config = "");

struct LeaderboardOptions {
  std::string preset = "tiny";
  std::vector<std::string> methods;
  std::string config;  // extra overrides applied to every method (after calibration)
  int64_t steps = 0, batch = 0;
  int64_t micro_batch = 0;  // rows per forward/backward; 0 = the preset's for each method
  uint64_t seed = 0;
  std::string data = "synthetic";
  std::string out;     // report path (JSON); the Markdown table (.md) and the HTML page (.html) go beside it
  int progress = 0;
  int64_t probe_sequences = -1;  // -1 = the preset's
  std::string device = "cpu";
};
nlohmann::json run_leaderboard(const LeaderboardOptions& opt, std::string& markdown);

}  // namespace mixbench
