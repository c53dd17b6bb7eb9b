// The nanochat GPT backbone (karpathy/nanochat 92d63d4, nanochat/gpt.py), with the token mixer
// of each layer taken from the registry: embed → for each step of the execution plan
// (harness/plan.h) the step's block (mixer + ReLU² MLP) inside the residual stream
// (harness/residual.h) → head. Parameters are plain tensors in a TensorMap named "wte", "lm_head",
// "smear_gate", "smear_lambda", the stream's own (nanochat's: "backout_lambda", "resid_lambdas",
// "x0_lambdas"), "ve.<i>", "layers.<i>.mlp.c_fc", "layers.<i>.mlp.c_proj" and
// "layers.<i>.mixer.<name>" for block i's mixer parameters.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/Generator.h>
#include <string>
#include <memory>
#include <vector>

#include "harness/accountant.h"
#include "harness/config.h"
#include "harness/plan.h"
#include "harness/registry.h"
#include "harness/residual.h"

namespace mixbench {

// Value embeddings (nanochat): layer i of n_layer adds one iff i % 2 == (n_layer − 1) % 2
// (alternate layers, the last always), to v through the gate 3·sigmoid(x[..., :kVeGateChannels]
// W_vegᵀ), one gate per value head. Defined in value_embed.cpp.
constexpr int64_t kVeGateChannels = 12;
bool layer_has_ve(const LayerCtx& ctx);

// Fields every method's config starts with.
ConfigSpec backbone_config();

struct ModelDims {
  int64_t n_layer, d_model, n_head, head_dim, seq_len, vocab;
  int64_t mlp_hidden;  // ReLU² MLP width (nanochat: 4·d_model)
};
// d_model = 0 -> nanochat's rule ceil(64L/128)·128; mlp_hidden = 0 -> 4·d_model
ModelDims model_dims(const Config& cfg);

// RMSNorm eps: nanochat calls F.rms_norm with eps=None, i.e. the float32 machine epsilon.
constexpr double kRmsEps = 1.1920928955078125e-07;

// The execution plan a method's model runs (MethodSpec::plan, else the plain n_layer stack), and
// its residual stream (MethodSpec::residual, else nanochat's). The plan's block count must be n_layer.
ExecPlan model_plan(const MethodSpec& method, const Config& cfg);
std::shared_ptr<const ResidualStream> model_stream(const MethodSpec& method, const Config& cfg);

// The method and config each layer runs: for a hybrid (MethodSpec::layout) the layout's method
// with its overrides applied to cfg, else the method itself with cfg, n_layer times.
struct LayerMethod {
  const MethodSpec* method;
  Config cfg;
};
std::vector<LayerMethod> layer_methods(const MethodSpec& method, const Config& cfg);
struct Model;
// A model's config replaced by one with the same parameters (a sweep's seq_len, which sets windows):
// cfg and every layer's config follow it. std::logic_error when the layer methods would change.
void set_model_config(Model& m, const Config& cfg);

struct Model {
  const MethodSpec* method = nullptr;
  Config cfg;
  ModelDims dims{};
  std::vector<std::string> layer_mixers;  // per-layer method name (a hybrid's layout; else method->name)
  std::vector<Config> layer_cfgs;         // per-layer config (cfg plus the layout's overrides)
  std::vector<const MethodSpec*> layer_specs;  // per-layer method (outlives the model: the registry's, or the caller's)
  ExecPlan plan;                               // which block runs at each step
  std::shared_ptr<const ResidualStream> stream;
  TensorMap params;
  std::map<std::string, ParamDef> defs;   // name -> definition (group, init)
  int64_t step = -1;  // training step handed to every layer (LayerCtx::step); -1 = not training
  uint64_t seed = 0;  // the run's seed, handed to the residual stream (Sublayer::seed)
  int64_t row0 = 0;   // global batch index of the first row the next pass runs (Sublayer::row0)
  // The training run's final stage that trains only the stream's exit gate
  // (ResidualStream::gate_params): model_loss takes the stream's gate-only loss.
  bool exit_gate_only = false;
};

// Builds all parameters with nanochat's initialisation (or `random_nonzero` for conformance).
Model build_model(const MethodSpec& method, const Config& cfg, at::Generator& gen,
                  const at::TensorOptions& opts, bool random_nonzero = false);

// Parameter counts of the built tensors, split by group (the audit compares these to the accountant).
ParamCount count_params(const Model& m);

// Auxiliary training losses the layers return besides "y" (output "aux_loss": the sparse
// methods' indexer / gate KL). Undefined tensors when no layer returns one.
struct ModelAux {
  at::Tensor aux_loss;                // Σ over layers (scalar)
  std::vector<at::Tensor> layer_aux;  // per layer (undefined for a layer without one)
  // A stream with several exits (ResidualStream::exits): the exits and every exit's logits
  // [K,B,T,vocab] (undefined with one exit).
  ResidualStream::Exits exits;
  at::Tensor exit_logits;
};
// logits [B,T,vocab] (fp32, or fp64 for an fp64 model; softcapped) for idx [B,T] int64 (with
// several exits, each token's chosen exit's). With
// `aux`, the layers' auxiliary losses are collected into it, and the plan's auxiliary routes
// (harness/plan.h), which feed only auxiliary losses, run; without it they are skipped. Backend::Reference runs every
// layer's FP64 reference (MethodSpec::reference) around the same backbone.
at::Tensor model_forward(const Model& m, const at::Tensor& idx, Backend backend, ModelAux* aux = nullptr);
// Incremental decoding state of a model: one cache per layer (MethodSpec::prefill/decode), the
// previous token's normalized embedding (the smear reads it) and the tokens consumed.
struct ModelCache {
  std::vector<TensorMap> layers;  // one per plan slot (a block applied k times has k caches)
  at::Tensor prev_embed;  // [B,1,d]
  int64_t pos = 0;
  // Static caches (capacity > 0, model_has_static_decode): every buffer is allocated once for
  // `capacity` tokens and updated in place, and the position is also on the device (pos_dev, int64
  // [1], advanced in place by each step), so that a CUDA graph can capture model_decode_step. A
  // later prefill of the same batch size reuses the buffers.
  int64_t capacity = 0;
  at::Tensor pos_dev;
  int64_t bytes() const;  // Σ cache_bytes over layers (the smear's one embedding excluded)
};
// Whether every layer's method registers prefill/decode.
bool model_has_decode(const Model& m);
// Whether the model can decode with static caches: every layer's hooks keep them
// (MethodSpec::static_decode) and its residual stream reads no host-side position.
bool model_has_static_decode(const Model& m);
// Forward over idx [B,T] returning only the last position's logits [B,1,vocab] (fp32,
// softcapped): the lm_head runs on one position per sequence. With `cache` (every layer must have
// a decode hook, else UsageError) the layers' prefill hooks fill it for model_decode_step. With
// `capacity` > 0 the cache is static (ModelCache::capacity; T < capacity; UsageError when the
// model cannot keep one); a static cache of the same capacity and batch size is reused in place.
at::Tensor model_prefill(const Model& m, const at::Tensor& idx, Backend backend, ModelCache* cache = nullptr,
                         int64_t capacity = 0);
// One token idx_t [B,1] at position cache.pos: smear with the previous embedding, the same
// residual / x0 / backout stream as model_forward, each layer's decode hook; returns logits
// [B,1,vocab] and advances the cache. model_prefill(T−n) then n steps == model_forward(T).
at::Tensor model_decode_step(const Model& m, const at::Tensor& idx_t, ModelCache& cache, Backend backend);
// Training loss: mean cross-entropy (nats) over targets != -1, plus the layers' auxiliary losses
// with weight 1 (their sum; seed 001). `lm_loss` / `aux` receive the cross-entropy alone and the
// auxiliary sum (undefined when no layer returns one). A stream with several exits gives the loss
// from every exit's cross-entropy (ResidualStream::exit_loss; `lm_loss` its expected cross-entropy,
// `aux` the rest plus the layers' auxiliary sum).
at::Tensor model_loss(const Model& m, const at::Tensor& idx, const at::Tensor& targets, Backend backend,
                      at::Tensor* lm_loss = nullptr, ModelAux* aux = nullptr);

// Fill a tensor per its ParamDef init rule (nanochat init).
void init_param(at::Tensor& t, const ParamDef& def, at::Generator& gen);
// Random, never-zero values of the right scale for conformance cases.
at::Tensor random_param(const ParamDef& def, at::Generator& gen, const at::TensorOptions& opts);

// Model-level accounting: backbone + Σ layers.
struct ModelCost {
  ParamCount params;
  double train_flops_nanochat = 0;  // 6·N_matmul + Σ mixer core terms (nanochat's convention)
  double fwd_flops = 0;             // executed forward FLOPs per token at T (exact causal pairs)
  double uncounted_flops = 0;       // Σ layers' LayerCost::uncounted_flops (not visible to FlopCounter)
  // Forward FLOPs per token the plan's auxiliary routes (harness/plan.h) add to a pass that runs
  // them (training; model_forward collecting ModelAux), and their element-wise part. Included in
  // train_flops_nanochat, not in fwd_flops or decode_flops.
  double aux_route_fwd_flops = 0;
  double aux_route_uncounted_flops = 0;
  double decode_flops = 0;          // per token at context c
  double act_bytes = 0;             // activation bytes per token (training)
  double cache_bytes_per_token = 0; // KV cache growth per token (all layers)
  double state_bytes = 0;           // fixed state per sequence (all layers)
  double decode_read_bytes = 0;     // cache bytes one decode step reads per sequence at context q.context (all layers)
  std::vector<LayerCost> layers;  // per plan step (a block applied k times appears k times; auxiliary routes' too)
  std::vector<PlanStep> steps;    // the plan step of each entry of `layers`
};
ModelCost account_model(const MethodSpec& method, const Config& cfg, const CostQuery& q);

}  // namespace mixbench
