#include "suites/train.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <utility>
#include <set>
#include <tuple>
#include <iostream>

#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/checkpoint_in.h"
#include "suites/step_graph.h"
#include "suites/step_trace.h"
#include "suites/sweep_measure.h"
#include "suites/distributed.h"
#include "suites/train_eval.h"
#include "harness/metrics.h"
#include "harness/tf32_scope.h"

namespace mixbench {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {
// Logits of idx [R, T] computed `micro` rows at a time (all at once for micro ≥ R).
at::Tensor forward_rows(const Model& m, const at::Tensor& idx, Backend backend, int64_t micro) {
  if (micro <= 0 || micro >= idx.size(0)) return model_forward(m, idx, backend);
  std::vector<at::Tensor> parts;
  for (int64_t r0 = 0; r0 < idx.size(0); r0 += micro)
    parts.push_back(model_forward(m, idx.slice(0, r0, std::min(idx.size(0), r0 + micro)), backend));
  return at::cat(parts, 0);
}

// One validation batch's cross-entropy sum (nats) and scored-token count, fp64 on the device (a
// byte-level corpus scores every target but BOS).
std::pair<at::Tensor, at::Tensor> batch_sums(const Model& m, const Corpus& c, const at::Tensor& x, const at::Tensor& y,
                                             Backend backend, int64_t micro) {
  const at::Tensor logits = forward_rows(m, x, backend, micro);
  const at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}), {},
                                               at::Reduction::None, -1).to(at::kDouble);
  const at::Tensor w = c.byte_level ? (y.reshape({-1}) != c.bos).to(at::kDouble) : at::ones_like(ce);
  return {(ce * w).sum(), w.sum()};
}

double evaluate(const Model& m, const Corpus& c, int64_t B, int64_t T, int64_t n_batches, Backend backend,
                int64_t micro, int64_t* scored = nullptr) {
  c10::NoGradGuard ng;
  double nats = 0, count = 0;
  const at::Device dev = m.params.at("wte").device();
  for (int64_t k = 0; k < n_batches; ++k) {
    at::Tensor x, y;
    get_batch(c.val, k * B * (T + 1), B, T, x, y);
    const auto [n, w] = batch_sums(m, c, x.to(dev), y.to(dev), backend, micro);
    nats += n.item<double>();
    count += w.item<double>();
  }
  if (scored) *scored = int64_t(count);
  return count > 0 ? nats / (std::log(2.0) * count) : 0.0;
}

std::string fingerprint(const TrainResult& r, int64_t steps, int64_t B, uint64_t seed, const std::string& data_hash) {
  return fnv1a_hex(fmt::format("{}|{}|{}|{}|{}|{}", r.method, r.cfg.str(), steps, B, seed, data_hash));
}

// The method's config at the preset with the run's overrides, its sparse warm-up resolved for the
// run's length.
Config run_config(const TrainPreset& P, const MethodSpec& ms, const TrainOptions& opt, int64_t steps) {
  return resolve_full_attention_warmup(ms.config.parse(P.config_for(ms.name) + (opt.config.empty() ? "" : "," + opt.config)),
                                       steps);
}
}  // namespace

int64_t gate_stage_start(const MethodSpec& m, const Config& cfg, const TrainPreset& p, int64_t steps) {
  if (model_stream(m, cfg)->gate_params().empty()) return steps;
  const int64_t given = cfg.has("gate_stage_steps") ? cfg.i("gate_stage_steps") : -1;
  const int64_t n = given >= 0 ? given : std::llround(p.gate_stage_frac * double(steps));
  if (n >= steps)
    throw UsageError(fmt::format("the gate-only stage of {} steps covers all {} training steps of {} (lower "
                                 "gate_stage_steps or the preset's gate_stage_frac)",
                                 n, steps, m.name));
  return steps - n;
}

nlohmann::json optimizer_settings(const TrainOptions& opt) {
  const TrainPreset P = train_preset(opt.preset);
  const MethodSpec& ms = Registry::get().method(opt.method);
  const int64_t steps = run_length(opt, P).steps;
  const int64_t B = opt.batch > 0 ? opt.batch : P.batch;
  const Config cfg = run_config(P, ms, opt, steps);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  const Model model = build_model(ms, cfg, gen, at::TensorOptions().dtype(at::kFloat));
  TrainHyper h = P.hyper;
  h.schedule.steps = steps;
  const Optimizer optim(model, B * model_dims(cfg).seq_len, h);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& s : optim.settings(model)) {
    nlohmann::json row = {{"param", s.param},   {"shape", s.shape}, {"group", s.group},
                          {"optimizer", s.optimizer}, {"lr", s.lr},    {"beta1", s.beta1},
                          {"beta2", s.beta2},   {"eps", nullptr},   {"weight_decay", s.weight_decay}};
    if (s.optimizer == "muon") {
      row["matrix"] = s.matrix;
      row["matrices"] = s.matrices;
      row["matrix_lr"] = s.matrix_lr;
    } else {
      row["eps"] = s.eps;
    }
    rows.push_back(std::move(row));
  }
  return {{"method", ms.name}, {"preset", opt.preset}, {"config", cfg.to_json()}, {"batch_tokens", B * model_dims(cfg).seq_len},
          {"steps", steps}, {"params", rows}};
}

TrainResult run_train(const TrainOptions& opt) {
  const auto t_run = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const TrainPreset P = train_preset(opt.preset);
  const MethodSpec& ms = Registry::get().method(opt.method);
  const BudgetPlan plan = run_length(opt, P);
  const int64_t steps = plan.steps;
  const int64_t B = opt.batch > 0 ? opt.batch : P.batch;
  auto preset_micro = P.method_micro_batch.find(opt.method);
  const int64_t MB = opt.micro_batch > 0 ? opt.micro_batch
                     : preset_micro != P.method_micro_batch.end() ? std::min(preset_micro->second, B)
                     : P.micro_batch > 0                           ? std::min(P.micro_batch, B)
                                                                   : B;
  if (MB < 1 || B % MB != 0)
    throw UsageError(fmt::format("--micro-batch {} must divide the batch of {} rows", MB, B));
  // Several ranks: each trains its contiguous share of the step's rows, in micro-batches of at most MB.
  DataParallel* dp = opt.data_parallel.get();
  const bool rank0 = !dp || dp->rank() == 0;
  const RowShare share = dp ? dp->share(B) : RowShare{0, B};
  const int64_t MBr = std::min(MB, share.rows);
  if (share.rows % MBr != 0)
    throw UsageError(fmt::format("--micro-batch {} must divide each rank's share of {} rows", MBr, share.rows));
  const int64_t eval_every = opt.eval_every > 0 ? opt.eval_every : P.eval_every;
  const int64_t eval_batches = opt.eval_batches > 0 ? opt.eval_batches : P.eval_batches;
  const int64_t ckpt_every = opt.checkpoint_every > 0 ? opt.checkpoint_every : P.checkpoint_every;
  const int64_t log_every = opt.log_every > 0 ? opt.log_every : P.log_every;
  if (opt.resume && opt.out.empty()) throw UsageError("--resume needs --out DIR (where the checkpoint is)");
  TrainResult r;
  r.budget = plan;
  r.method = ms.name;
  r.cfg = run_config(P, ms, opt, steps);
  const ModelDims d = model_dims(r.cfg);
  const int64_t T = d.seq_len;
  const std::string data = opt.data.empty() ? P.data : opt.data;
  Corpus corpus = load_corpus(data, opt.seed, T, steps * B * (T + 1));
  r.byte_level = corpus.byte_level;
  if (corpus.max_token >= d.vocab)
    throw InputError(fmt::format("data holds token {} but the vocabulary has {} entries (set vocab=)", corpus.max_token,
                                 d.vocab));
  CostQuery q;
  q.T = T;
  r.cost = account_model(ms, r.cfg, q);

  if (opt.device != "cpu" && opt.device != "cuda")
    throw UsageError(fmt::format("unknown device '{}' (cpu or cuda)", opt.device));
  if (opt.device == "cuda" && !at::hasCUDA()) throw UsageError("--device cuda: no CUDA device is available");
  const at::Device dev = opt.device == "cuda" ? at::Device(at::kCUDA, dp ? dp->local_rank() : 0) : at::Device(at::kCPU);
  const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
  r.device = opt.device;
  const Tf32Scope tf32(opt.device == "cuda");  // fp32 compute: TF32 matmuls during this run
  r.dtype = opt.dtype.empty() ? (opt.device == "cuda" ? "bf16" : "fp32") : opt.dtype;
  if (r.dtype != "bf16" && r.dtype != "fp32")
    throw UsageError(fmt::format("--dtype {}: training computes in bf16 or fp32 (fp32 master weights either way)", r.dtype));
  const at::ScalarType compute = parse_dtype(r.dtype);
  // Small CPU models: the per-op work is too small for intra-op threads to pay off, and on a loaded
  // machine their synchronisation costs more than the work (measured 13× slower with 2 threads).
  struct ThreadsGuard {
    int saved = 0;
    explicit ThreadsGuard(int n) {
      if (n > 0) {
        saved = at::get_num_threads();
        at::set_num_threads(n);
      }
    }
    ~ThreadsGuard() {
      if (saved > 0) at::set_num_threads(saved);
    }
  } threads_guard(opt.device == "cpu" ? P.cpu_threads : 0);
  r.threads = opt.device == "cpu" ? at::get_num_threads() : 0;
  r.world_size = dp ? dp->world() : 1;
  r.backend = dp ? dp->backend() : "none";

  // Parameters are drawn on the CPU (the same values on every device), then moved.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  Model model = build_model(ms, r.cfg, gen, at::TensorOptions().dtype(at::kFloat));
  if (!opt.init_from.empty()) {  // parameters trained elsewhere replace the initialisation
    const SafetensorsFile init = read_safetensors(opt.init_from, "checkpoint");
    if (opt.init_level == "layer") load_layer_state(init, opt.init_from, model, opt.init_layers, "");
    else load_model_state(init, opt.init_from, model);
  }
  model.seed = opt.seed;  // streams that sample (a loop depth, an initial state) draw from the run's seed
  if (dev.is_cuda()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : model.params) names.push_back(n);
    for (const auto& n : names) model.params.set(n, model.params.at(n).to(dev));
  }
  for (const auto& [n, t] : model.params) t.requires_grad_(true);
  // The exit-gate-only final stage (a stream with exit gates, ouro): the run's last
  // gate_stage_steps (the method's, or the preset's gate_stage_frac of the run) train only the
  // gate; the other parameters keep their values and optimizer state.
  const std::vector<std::string> gate_names = model.stream->gate_params();
  const std::set<std::string> gate_set(gate_names.begin(), gate_names.end());
  const int64_t gate_from = gate_stage_start(ms, r.cfg, P, steps);  // steps: no such stage
  auto set_gate_stage = [&](Model& mm, bool on) {
    mm.exit_gate_only = on;
    for (const auto& [n, t] : mm.params)
      if (!gate_set.count(n)) t.requires_grad_(!on);
  };
  TrainHyper h = P.hyper;
  h.schedule.steps = steps;
  Optimizer optim(model, B * T, h);

  // a different micro-batching changes the rounding of the accumulated gradients: part of the run
  const std::string fp = fingerprint(r, steps, B, opt.seed, corpus.hash + "|" + corpus.order) +
                         (opt.init_from.empty() ? "" : "/init:" + fnv1a_hex(opt.init_from + "|" + opt.init_level)) + (MB == B ? "" : fmt::format("/mb{}", MB)) +
                         (compute == at::kFloat ? "" : "/" + r.dtype) +
                         (gate_names.empty() ? "" : fmt::format("/gate{}", steps - gate_from));
  // what a run continuing from a snapshot must share with the run it was taken from (all but the length)
  const std::string branch_fp = fingerprint(r, 0, B, opt.seed, data + "|" + corpus.order) + (MB == B ? "" : fmt::format("/mb{}", MB)) +
                                (compute == at::kFloat ? "" : "/" + r.dtype);
  const std::string ckpt = opt.out.empty() ? "" : (fs::path(opt.out) / "checkpoint.safetensors").string();
  int64_t start = 0, pos = 0;
  double prior_seconds = 0;
  if (opt.resume || opt.start_from) {
    const SafetensorsFile f = opt.start_from ? *opt.start_from : read_safetensors(ckpt, "checkpoint");
    auto meta = [&](const std::string& k) {
      auto it = f.metadata.find(k);
      if (it == f.metadata.end()) throw InputError(fmt::format("checkpoint '{}' lacks '{}'", ckpt, k));
      return it->second;
    };
    // The per-layer layout (a hybrid's layer methods) must be the model's, layer by layer.
    if (f.metadata.count("layer_mixers") || ms.is_hybrid()) {
      std::vector<std::string> saved;
      try {
        saved = Json::parse(meta("layer_mixers")).get<std::vector<std::string>>();
      } catch (const Json::exception&) {
        throw InputError(fmt::format("checkpoint '{}': layer_mixers is not a list of method names", ckpt));
      }
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
        return s;
      };
      if (saved != model.layer_mixers)
        throw InputError(fmt::format("checkpoint '{}' has the layer layout [{}] but {} at this config has [{}]", ckpt,
                                     join(saved), r.method, join(model.layer_mixers)));
    }
    if (opt.start_from ? meta("branch") != branch_fp : meta("fingerprint") != fp)
      throw InputError(fmt::format("checkpoint '{}' belongs to a different run (method, config, steps, batch, seed "
                                   "or data differ)", ckpt));
    start = std::stoll(meta("step"));
    pos = std::stoll(meta("data_pos"));
    prior_seconds = std::stod(meta("seconds"));
    r.losses = Json::parse(meta("losses")).get<std::vector<double>>();
    if (f.metadata.count("aux_losses")) r.aux_losses = Json::parse(meta("aux_losses")).get<std::vector<double>>();
    for (const auto& e : Json::parse(meta("val_curve"))) r.val_curve.emplace_back(e[0].get<int64_t>(), e[1].get<double>());
    c10::NoGradGuard ng;
    TensorMap opt_state;
    for (const auto& [n, t] : f.tensors) {
      if (n.rfind("param.", 0) == 0) {
        const std::string pn = n.substr(6);
        if (!model.params.has(pn) || model.params.at(pn).sizes() != t.sizes())
          throw InputError(fmt::format("checkpoint parameter '{}' does not fit the model", pn));
        model.params.at(pn).copy_(t);
      } else if (n.rfind("opt.", 0) == 0) {
        opt_state.set(n.substr(4), t);
      }
    }
    optim.load_state(opt_state);
    if (f.tensors.has("rng_state")) gen.set_state(f.tensors.at("rng_state"));
    if (int64_t(r.losses.size()) != start) throw InputError("checkpoint loss history does not match its step");
  }

  // The gradients summed over the ranks; the logged losses too, when they are logged (every rank
  // logs at the same steps: rank 0's progress mode).
  std::unique_ptr<GradientReducer> reducer = dp ? dp->reducer(model) : nullptr;
  const int progress = dp ? int(dp->from_rank0(opt.progress)) : opt.progress;
  size_t losses_summed = r.losses.size();
  auto sum_losses = [&] {
    if (!dp) return;
    dp->sum(r.losses, losses_summed);
    if (!r.aux_losses.empty()) dp->sum(r.aux_losses, losses_summed);
    losses_summed = r.losses.size();
  };

  auto capture = [&](int64_t step_done, double seconds) {
    RunSnapshot snap;
    // copies: the run goes on changing the parameters and the optimizer state in place
    for (const auto& [n, p] : model.params) snap.tensors.set("param." + n, p.detach().cpu().clone());
    for (const auto& [n, s] : optim.state()) snap.tensors.set("opt." + n, s.cpu().clone());
    snap.tensors.set("rng_state", gen.get_state());
    Json vc = Json::array();
    for (const auto& [s, v] : r.val_curve) vc.push_back({s, v});
    snap.metadata = {{"fingerprint", fp}, {"branch", branch_fp}, {"step", std::to_string(step_done)},
                     {"data_pos", std::to_string(pos)}, {"seconds", fmt::format("{:.17g}", seconds)},
                     {"losses", Json(r.losses).dump()}, {"val_curve", vc.dump()}, {"method", r.method},
                     {"config", r.cfg.str()}, {"layer_mixers", Json(model.layer_mixers).dump()},
                     {"aux_losses", Json(r.aux_losses).dump()}, {"world_size", std::to_string(r.world_size)}};
    return snap;
  };
  auto save = [&](int64_t step_done, double seconds) {
    if (ckpt.empty() || !rank0) return;  // rank 0 writes (atomically); the others' state is the same
    fs::create_directories(opt.out);
    const RunSnapshot snap = capture(step_done, seconds);
    write_safetensors(ckpt, snap.tensors, snap.metadata);
  };

  // The matmul rate this device sustains in the compute dtype: MFU's denominator (per device: the
  // tokens/s of several ranks are over as many devices).
  r.peak = matmul_peak(opt.device, compute);
  auto run_mfu = [&](double tps) { return mfu(r.cost.train_flops_nanochat, tps, r.peak) / double(r.world_size); };

  // The compute model: the same blocks, its parameters the compute-dtype copies of the fp32 masters,
  // made inside each micro-batch's graph so that the gradients flow back into the masters in fp32.
  Model cm = model;
  auto compute_model = [&]() -> const Model& {
    if (compute == at::kFloat) return model;
    cm.params = TensorMap();  // the previous copies go first (with their autograd nodes)
    for (const auto& [n, p] : model.params) cm.params.set(n, p.to(compute));
    return cm;
  };

  // Losses stay on the device until they are read back (at log, evaluation and checkpoint steps):
  // reading a value synchronises the host with the device.
  std::vector<at::Tensor> pending_lm, pending_aux;
  auto flush_losses = [&] {
    if (pending_lm.empty()) return;
    at::Tensor lm = at::stack(pending_lm).to(at::kDouble).cpu();
    for (int64_t k = 0; k < lm.size(0); ++k) r.losses.push_back(lm[k].item<double>());
    if (!pending_aux.empty()) {
      at::Tensor ax = at::stack(pending_aux).to(at::kDouble).cpu();
      for (int64_t k = 0; k < ax.size(0); ++k) r.aux_losses.push_back(ax[k].item<double>());
    }
    pending_lm.clear();
    pending_aux.clear();
  };

  const int64_t N = corpus.train.size(0);
  double seconds = 0, steady_seconds = 0;
  int64_t steady_tokens = 0;
  int64_t done = start;
  // Forward and backward over the step's rows in micro-batches of MB: each micro-batch's mean loss
  // weighted by MB/B, so the accumulated gradient (and the logged losses) are the whole batch's means.
  // Returns the LM loss and the auxiliary loss (undefined without one), on the device.
  // Over several ranks each runs its share of the rows with the same MB/B weights, so the sums over
  // the ranks are those means.
  auto forward_backward = [&](const at::Tensor& x, const at::Tensor& y) {
    at::Tensor lm_sum, aux_sum;
    for (int64_t r0 = 0; r0 < share.rows; r0 += MBr) {
      at::Tensor lm_loss;
      ModelAux aux;
      const double w = double(MBr) / double(B);
      model.row0 = cm.row0 = share.first + r0;  // the micro-batch's first row in the global batch
      at::Tensor loss = model_loss(compute_model(), MBr == B ? x : x.slice(0, r0, r0 + MBr),
                                   MBr == B ? y : y.slice(0, r0, r0 + MBr), backend, &lm_loss, &aux);
      if (reducer) reducer->arm(r0 + MBr >= share.rows);  // the last backward reduces as it goes
      (MBr == B ? loss : loss * w).backward();
      at::Tensor lm_w = lm_loss.detach().to(at::kDouble) * w;
      lm_sum = lm_sum.defined() ? lm_sum + lm_w : lm_w;
      if (aux.aux_loss.defined()) {
        at::Tensor a_w = aux.aux_loss.detach().to(at::kDouble) * w;
        aux_sum = aux_sum.defined() ? aux_sum + a_w : a_w;
      }
    }
    // The compute copies hold the autograd nodes that accumulate into the masters; released here, so
    // the next step (or a graph capture on another stream) builds its own.
    if (compute != at::kFloat) cm.params = TensorMap();
    return std::make_pair(lm_sum, aux_sum);
  };

  // On a GPU a whole step (the forward and backward of all its micro-batches, and the optimizer) is
  // captured once in a CUDA graph and replayed: one launch instead of thousands. Static buffers hold
  // the batch, the losses and the gradients (each replay's backward writes them afresh); the
  // optimizer's step-dependent values (learning rates, Muon momentum and weight decay, AdamW's bias
  // corrections) live in a small device buffer that the host writes before each replay, so the
  // replayed kernels run each step's schedule. Every step of such a run, the eager ones too, reads
  // that buffer, so a run resumed or branched at any step runs the same kernels on the same values.
  // With --graph fwd-bwd (or when the optimizer cannot be captured) the graph holds the forward and
  // backward and the optimizer runs eagerly after each replay with host values. Capture waits for
  // the layers to stop depending on the step (the sparse methods' full-attention warm-up) and falls
  // back to eager steps, with the reason in the report, where the method cannot be captured.
  const bool graph_wanted = dev.is_cuda() && opt.graph != "off" && !dp;
  std::string no_graph = !dev.is_cuda()     ? "not on a GPU"
                         : opt.graph == "off" ? "--graph off"
                         : dp                 ? "data parallel: the gradients are all-reduced from hooks during the backward"
                                              : "";
  std::string no_step_graph = graph_wanted && opt.graph == "fwd-bwd" ? "--graph fwd-bwd" : "";
  if (graph_wanted && no_step_graph.empty()) optim.use_device_scalars();
  std::string step_dependence;  // why the last uncaptured step ran eagerly
  auto step_dependent = [&](int64_t it) -> std::string {
    if (it == gate_from) return "the switch to the gate-only stage";  // runs eagerly, then is captured anew
    return mixbench::step_dependence(model, it);
  };
#if defined(MIXBENCH_WITH_CUDA)
  StepGraph graph;
  bool graph_has_optimizer = false;
  int64_t capture_step_at = -1;
  at::Tensor graph_x, graph_y, graph_lm, graph_aux;
  // Captures the step: forward + backward, and the optimizer's kernels when `with_optimizer`.
  // Returns "" or the error's first line (the graph and the gradients then cleared).
  auto try_capture = [&](bool with_optimizer, const std::set<std::string>* only) {
    return graph.capture(
        [&] {
          std::tie(graph_lm, graph_aux) = forward_backward(graph_x, graph_y);
          if (with_optimizer) optim.apply(model, only);
        },
        [&] {
          graph_lm = graph_aux = at::Tensor();
          for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
        });
  };
  auto capture_step = [&](const at::Tensor& x, const at::Tensor& y, const std::set<std::string>* only) {
    graph_x = x.clone();
    graph_y = y.clone();
    // a warm-up pass on the capture stream (its gradients are discarded), then the capture
    graph.warm_up([&] { forward_backward(graph_x, graph_y); });
    for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
    const bool with_optimizer = no_step_graph.empty();
    std::string failed = try_capture(with_optimizer, only);
    if (!failed.empty() && with_optimizer) {
      // the optimizer (or the step) could not be captured: forward + backward alone, the optimizer eager
      // (still on the device scalars: the same kernels as the steps before)
      no_step_graph = "capture with the optimizer failed: " + failed;
      failed = try_capture(false, only);
    }
    if (failed.empty()) {
      r.graph = true;
      graph_has_optimizer = with_optimizer && no_step_graph.empty();
      if (r.graph_scope != "forward_backward") r.graph_scope = graph_has_optimizer ? "step" : "forward_backward";
    } else {
      no_graph = "capture failed: " + failed;
    }
    sweep_detail::sync_device(opt.device);
  };
#else
  if (graph_wanted) no_graph = "built without CUDA";
  (void)step_dependent;
#endif

  // The validation bpb over n_batches of the validation stream (evaluate()'s arithmetic). On a GPU,
  // unless graphs are off, the forward with its cross-entropy sums is captured once, at the first
  // evaluation whose forward no longer depends on the step, on a compute-dtype copy of the masters that every evaluation refreshes in place, and
  // replayed for every batch after the first; the sums (double, on the device, added in evaluate()'s
  // order) are read back once per evaluation. A capture that fails leaves the evaluation eager.
  r.eval_graph_reason = !dev.is_cuda()     ? "not on a GPU"
                        : opt.graph == "off" ? "--graph off"
                        : dp                 ? "data parallel: the other ranks' collectives run while rank 0 evaluates"
                                             : "";
#if defined(MIXBENCH_WITH_CUDA)
  StepGraph eval_graph;
  Model em;
  at::Tensor ex, ey, e_nats, e_count;
  auto eval_body = [&] {
    const auto [n, w] = batch_sums(em, corpus, ex, ey, backend, MB);
    e_nats.add_(n);
    e_count.add_(w);
  };
#endif
  auto validate = [&](int64_t n_batches) -> double {
#if defined(MIXBENCH_WITH_CUDA)
    // a forward that depends on the step (the sparse methods' full-attention warm-up, a loop depth
    // sampled per step) is evaluated eagerly at that step; once it no longer does, it is captured
    if (r.eval_graph_reason.empty() && mixbench::step_dependence(model, model.step).empty()) {
      c10::NoGradGuard ng;
      if (!ex.defined()) {  // the copy the graph reads: its own buffers, whatever the masters' storage does later
        em = model;
        em.params = TensorMap();
        for (const auto& [n, p] : model.params) em.params.set(n, p.detach().to(compute, /*non_blocking=*/false, /*copy=*/true));
        const auto lng = at::TensorOptions().dtype(at::kLong).device(dev);
        ex = at::empty({B, T}, lng);
        ey = at::empty({B, T}, lng);
        e_nats = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(dev));
        e_count = at::zeros_like(e_nats);
      } else {
        for (const auto& [n, p] : model.params) em.params.at(n).copy_(p.detach());
      }
      em.step = model.step;
      e_nats.zero_();
      e_count.zero_();
      for (int64_t k = 0; k < n_batches; ++k) {
        at::Tensor x, y;
        get_batch(corpus.val, k * B * (T + 1), B, T, x, y);
        ex.copy_(x);
        ey.copy_(y);
        if (eval_graph.held()) {
          eval_graph.replay();
        } else if (!r.eval_graph && r.eval_graph_reason.empty()) {
          eval_graph.warm_up(eval_body);  // this batch's sums, on the capture stream
          const std::string failed = eval_graph.capture(eval_body, [] {});
          if (failed.empty()) r.eval_graph = true;
          else r.eval_graph_reason = "capture failed: " + failed;
        } else {
          eval_body();
        }
      }
      const double nats = e_nats.item<double>(), count = e_count.item<double>();
      r.val_tokens = int64_t(count);
      return count > 0 ? nats / (std::log(2.0) * count) : 0.0;
    }
#endif
    return evaluate(compute_model(), corpus, B, T, n_batches, backend, MB, &r.val_tokens);
  };

  // The traced steps: after the process's first (warm-up) step and the graph's capture when there are.
  StepTrace tracer;
  const int64_t trace_from = opt.trace.empty() ? -1 : std::min(start + (graph_wanted ? 2 : 1), steps - 1);
  const int64_t trace_to = trace_from < 0 ? -1 : std::min(steps, trace_from + std::max<int64_t>(1, opt.trace_steps));
  double trace_wall = 0;
  r.phase_seconds.setup = since(t_run);
  // the peak from here on (the device's memory in use now, parameters and optimizer state, included)
  sweep_detail::MemProbe mem{opt.device};
  mem.start();
  for (int64_t it = start; it < steps; ++it) {
    if (it == trace_from) {
      sweep_detail::sync_device(opt.device);
      tracer.start(dev.is_cuda());
    }
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor x, y;
    if (dp) dp->step_begins(it);
    get_batch(corpus.train, pos, B, T, x, y);
    pos = (pos + B * (T + 1)) % N;
    if (share.rows != B) {
      x = x.slice(0, share.first, share.first + share.rows);
      y = y.slice(0, share.first, share.first + share.rows);
    }
    if (dev.is_cuda()) {
      x = x.to(dev, /*non_blocking=*/true);
      y = y.to(dev, /*non_blocking=*/true);
    }
    // The layers see the step (the sparse methods' full-attention warm-up); the evaluations
    // after it run the model as this step trained it.
    model.step = it;
    cm.step = it;
    const bool gate_stage = it >= gate_from;
    if (gate_stage != model.exit_gate_only) {
      set_gate_stage(model, gate_stage);
      cm.exit_gate_only = gate_stage;
    }
    at::Tensor lm_sum, aux_sum;
    bool replayed = false;
    const std::set<std::string>* only = gate_stage ? &gate_set : nullptr;
    bool optimized = false;  // the replayed graph held the optimizer
#if defined(MIXBENCH_WITH_CUDA)
    if (graph.held() && it == gate_from) {  // the graph replays the first stage's step
      graph.reset();
      graph_has_optimizer = false;
      graph_lm = graph_aux = at::Tensor();
      for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
    }
    if (graph_wanted && !graph.held() && no_graph.empty() && it > start) {
      step_dependence = step_dependent(it);
      if (step_dependence.empty()) {
        capture_step(x, y, only);
        capture_step_at = it;
      }
    }
    if (graph.held()) {
      graph_x.copy_(x, /*non_blocking=*/true);
      graph_y.copy_(y, /*non_blocking=*/true);
      if (graph_has_optimizer) optim.write_scalars(it);  // this step's values, before the replay reads them
      graph.replay();
      lm_sum = graph_lm.clone();
      if (graph_aux.defined()) aux_sum = graph_aux.clone();
      replayed = true;
      optimized = graph_has_optimizer;
    }
#endif
    if (!replayed) std::tie(lm_sum, aux_sum) = forward_backward(x, y);
    if (reducer) reducer->finish();
    pending_lm.push_back(lm_sum);
    if (aux_sum.defined()) pending_aux.push_back(aux_sum);
    if (!optimized) optim.step(model, it, only);
    // Eager steps start from no gradients; a graph's gradients are its static buffers, overwritten by
    // every replay.
    if (!replayed)
      for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
    done = it + 1;
    const bool do_eval = done % eval_every == 0 || done == steps;
    const bool stopping = opt.stop_after > 0 && done >= opt.stop_after;
    const bool do_save = done % ckpt_every == 0 || done == steps || stopping;
    const bool do_log = progress && (done % log_every == 0 || do_eval);
    bool first = it == start;  // steps that include one-time work stay out of the steady rate
#if defined(MIXBENCH_WITH_CUDA)
    first = first || it == capture_step_at;
#endif
    // The clock stops on a synchronised device wherever the host is about to wait for it anyway, and
    // after the process's first step (which the steady rate excludes).
    const bool traced = tracer.active();
    if (do_eval || do_save || do_log || first || traced || !dev.is_cuda()) sweep_detail::sync_device(opt.device);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds += dt;
    if (traced) {
      trace_wall += dt;
      if (done == trace_to) r.trace = tracer.stop(opt.trace, trace_wall, trace_to - trace_from);
    }
    if (it == start) r.first_step_s = dt;
    if (!first && !traced) {  // the profiler's own cost stays out of the rate
      steady_seconds += dt;
      steady_tokens += B * T;
    }
    if (do_eval || do_save || do_log || !dev.is_cuda()) {
      flush_losses();
      sum_losses();  // every rank reaches this at the same steps
    }
    if (do_eval && rank0) {
      c10::NoGradGuard ng;
      const auto te = std::chrono::steady_clock::now();
      r.val_curve.emplace_back(done, validate(eval_batches));
      r.phase_seconds.eval += since(te);
    }
    if (do_log && rank0) {
      const double tps = steady_tokens > 0 ? double(steady_tokens) / std::max(steady_seconds, 1e-9)
                                           : double(B * T) / std::max(seconds, 1e-9);
      const double eta = double(steps - done) * double(B * T) / std::max(tps, 1e-9);
      if (progress == 1) {
        Json j = {{"method", r.method}, {"step", done}, {"steps", steps}, {"loss", r.losses.back()},
                  {"lr_mult", lr_multiplier(h.schedule, it)}, {"tok_per_s", tps},
                  {"mfu", run_mfu(tps)}, {"eta_s", eta}};
        if (!r.aux_losses.empty()) j["aux_loss"] = r.aux_losses.back();
        if (do_eval) j["val_bpb"] = r.val_curve.back().second;
        std::cout << j.dump() << std::endl;
      } else if (do_eval || done % std::max<int64_t>(10, log_every) == 0) {
        std::cout << fmt::format("{} step {}/{}  loss {:.4f}{}{}  {:.0f} tok/s  mfu {:.1f}%  eta {:.0f}s\n", r.method, done,
                                 steps, r.losses.back(),
                                 r.aux_losses.empty() ? "" : fmt::format("  aux {:.4f}", r.aux_losses.back()),
                                 do_eval ? fmt::format("  val bpb {:.4f}", r.val_curve.back().second) : "", tps,
                                 100 * run_mfu(tps), eta)
                  << std::flush;
      }
    }
    if (do_save) {
      const auto ts = std::chrono::steady_clock::now();
      save(done, prior_seconds + seconds);
      r.phase_seconds.checkpoint += since(ts);
    }
    if (stopping) break;
    if (opt.snapshot_out && done == opt.snapshot_at) {
      flush_losses();
      sum_losses();
      *opt.snapshot_out = capture(done, prior_seconds + seconds);
      break;
    }
  }
  flush_losses();
  if (tracer.active()) r.trace = tracer.stop(opt.trace, trace_wall, done - trace_from);  // stopped early
  // why the scope is less than the whole step
  if (!r.graph && no_graph.empty())
    no_graph = !step_dependence.empty() ? "no step was captured: " + step_dependence
                                        : "no step was captured: the run has no step after its first";
  r.graph_reason = r.graph_scope == "step" ? "" : r.graph_scope == "forward_backward" ? no_step_graph : no_graph;
  r.steps_done = done;
  r.tokens = done * B * T;
  r.batch = B;
  r.micro_batch = MB;
  r.seconds = prior_seconds + seconds;
  r.tokens_per_s = steady_tokens > 0 ? double(steady_tokens) / std::max(steady_seconds, 1e-9)
                  : done > start    ? double((done - start) * B * T) / std::max(seconds, 1e-9)
                                    : 0.0;
  r.mfu = run_mfu(r.tokens_per_s);
  if (!r.val_curve.empty()) r.val_bpb = r.val_curve.back().second;
  // the final evaluation over more of the validation stream than the curve's (the preset's
  // final_eval_batches; −1: all of it), on a run that reached its end
  const int64_t final_setting = opt.final_eval_batches ? *opt.final_eval_batches : P.final_eval_batches;
  const int64_t final_batches = final_setting < 0 ? std::max<int64_t>(1, corpus.val.size(0) / (B * (T + 1)))
                                : final_setting > 0 ? final_setting
                                                    : eval_batches;
  if (done == steps && !(opt.snapshot_out && done == opt.snapshot_at) && final_batches != eval_batches && rank0) {
    c10::NoGradGuard ng;
    const auto te = std::chrono::steady_clock::now();
    r.val_bpb = validate(final_batches);
    r.phase_seconds.eval += since(te);
  }
  const int64_t n_probe = opt.probe_sequences >= 0 ? opt.probe_sequences : P.probe_sequences;
  const bool snapshotted = opt.snapshot_out && done == opt.snapshot_at;
  if (corpus.byte_level && n_probe > 0 && rank0 && !snapshotted) {
    c10::NoGradGuard ng;
    const Model& pm = compute_model();
    r.probes = evaluate_probes([&](const at::Tensor& idx) { return forward_rows(pm, idx.to(dev), backend, MB); }, T,
                               opt.seed, n_probe, corpus.bos);
  }
  if (dp) dp->barrier();  // the other ranks wait while rank 0 evaluates the probes
  r.phase_seconds.steps = seconds;
  r.memory = mem.finish();
  r.phase_seconds.total = since(t_run);
  return r;
}

Json train_result_json(const TrainResult& r) {
  const ModelDims d = model_dims(r.cfg);
  Json vc = Json::array();
  for (const auto& [s, v] : r.val_curve) vc.push_back({{"step", s}, {r.byte_level ? "bpb" : "bits_per_token", v}});
  Json j = {{"status", "ok"},
            {"method", r.method},
            {"level", "model"},
            {"device", r.device},
            {"threads", r.threads},
            {"world_size", r.world_size},
            {"backend", r.backend},
            {"dtype", r.dtype},
            {"master_dtype", "fp32"},
            {"config", r.cfg.to_json()},
            {"shape", {{"n_layer", d.n_layer}, {"d_model", d.d_model}, {"n_head", d.n_head}, {"head_dim", d.head_dim},
                       {"seq_len", d.seq_len}, {"vocab", d.vocab}}},
            {r.byte_level ? "val_bpb" : "val_bits_per_token", r.val_bpb},
            {"val_tokens", r.val_tokens},
            {"steps", r.steps_done},
            {"budget", r.budget.to_json()},
            {"batch", r.batch},
            {"micro_batch", r.micro_batch},
            {"tokens", r.tokens},
            {"seconds", r.seconds},
            {"tokens_per_s", r.tokens_per_s},
            {"first_step_s", r.first_step_s},
            {"phase_seconds", {{"setup", r.phase_seconds.setup}, {"steps", r.phase_seconds.steps},
                               {"eval", r.phase_seconds.eval}, {"checkpoint", r.phase_seconds.checkpoint},
                               {"total", r.phase_seconds.total}}},
            {"mfu", r.mfu},
            {"matmul_peak", matmul_peak_json(r.peak)},
            {"trace", r.trace},
            {"cuda_graph", r.graph},
            {"cuda_graph_scope", r.graph_scope},
            {"cuda_graph_reason", r.graph_reason},
            {"eval_cuda_graph", r.eval_graph},
            {"eval_cuda_graph_reason", r.eval_graph_reason},
            {"train_flops_per_token_nanochat", r.cost.train_flops_nanochat},
            {"params", {{"total", r.cost.params.total()}, {"matmul", r.cost.params.matmul}}},
            {"loss_curve", r.losses},
            {"aux_loss_curve", r.aux_losses},
            {"val_curve", vc},
            {"probes", r.probes.is_null() ? Json::object() : r.probes}};
  if (!r.memory.is_null()) j["memory"] = r.memory;
  return j;
}

}  // namespace mixbench
