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
#include <iostream>

#include "harness/errors.h"
#include "harness/io.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "suites/train_eval.h"

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

double evaluate(const Model& m, const Corpus& c, int64_t B, int64_t T, int64_t n_batches, Backend backend,
                int64_t micro) {
  c10::NoGradGuard ng;
  double nats = 0, count = 0;
  const at::Device dev = m.params.at("wte").device();
  for (int64_t k = 0; k < n_batches; ++k) {
    at::Tensor x, y;
    get_batch(c.val, k * B * (T + 1), B, T, x, y);
    x = x.to(dev);
    y = y.to(dev);
    at::Tensor logits = forward_rows(m, x, backend, micro);
    at::Tensor ce = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}), {},
                                           at::Reduction::None, -1).to(at::kDouble);
    at::Tensor w = c.byte_level ? (y.reshape({-1}) != c.bos).to(at::kDouble) : at::ones_like(ce);
    nats += (ce * w).sum().item<double>();
    count += w.sum().item<double>();
  }
  return count > 0 ? nats / (std::log(2.0) * count) : 0.0;
}

std::string fingerprint(const TrainResult& r, int64_t steps, int64_t B, uint64_t seed, const std::string& data_hash) {
  return fnv1a_hex(fmt::format("{}|{}|{}|{}|{}|{}", r.method, r.cfg.str(), steps, B, seed, data_hash));
}
}  // namespace

TrainResult run_train(const TrainOptions& opt) {
  const TrainPreset P = train_preset(opt.preset);
  const MethodSpec& ms = Registry::get().method(opt.method);
  const BudgetPlan plan = run_length(opt, P);
  const int64_t steps = plan.steps;
  const int64_t B = opt.batch > 0 ? opt.batch : P.batch;
  auto preset_micro = P.method_micro_batch.find(opt.method);
  const int64_t MB = opt.micro_batch > 0 ? opt.micro_batch
                     : preset_micro != P.method_micro_batch.end() ? std::min(preset_micro->second, B)
                                                                   : B;
  if (MB < 1 || B % MB != 0)
    throw UsageError(fmt::format("--micro-batch {} must divide the batch of {} rows", MB, B));
  const int64_t eval_every = opt.eval_every > 0 ? opt.eval_every : P.eval_every;
  const int64_t eval_batches = opt.eval_batches > 0 ? opt.eval_batches : P.eval_batches;
  const int64_t ckpt_every = opt.checkpoint_every > 0 ? opt.checkpoint_every : P.checkpoint_every;
  if (opt.resume && opt.out.empty()) throw UsageError("--resume needs --out DIR (where the checkpoint is)");
  TrainResult r;
  r.budget = plan;
  r.method = ms.name;
  r.cfg = ms.config.parse(P.config_for(ms.name) + (opt.config.empty() ? "" : "," + opt.config));
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
  const at::Device dev = opt.device == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const Backend backend = opt.device == "cuda" ? Backend::CUDA : Backend::CPU;
  r.device = opt.device;
  if (opt.device == "cuda") at::globalContext().setAllowTF32CuBLAS(true);  // fp32 weights, TF32 matmuls
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

  // Parameters are drawn on the CPU (the same values on every device), then moved.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  Model model = build_model(ms, r.cfg, gen, at::TensorOptions().dtype(at::kFloat));
  if (dev.is_cuda()) {
    std::vector<std::string> names;
    for (const auto& [n, t] : model.params) names.push_back(n);
    for (const auto& n : names) model.params.set(n, model.params.at(n).to(dev));
  }
  for (const auto& [n, t] : model.params) t.requires_grad_(true);
  TrainHyper h = P.hyper;
  h.schedule.steps = steps;
  Optimizer optim(model, B * T, h);

  // a different micro-batching changes the rounding of the accumulated gradients: part of the run
  const std::string fp = fingerprint(r, steps, B, opt.seed, corpus.hash) + (MB == B ? "" : fmt::format("/mb{}", MB));
  // what a run continuing from a snapshot must share with the run it was taken from (all but the length)
  const std::string branch_fp = fingerprint(r, 0, B, opt.seed, data) + (MB == B ? "" : fmt::format("/mb{}", MB));
  const std::string ckpt = opt.out.empty() ? "" : (fs::path(opt.out) / "checkpoint.safetensors").string();
  int64_t start = 0, pos = 0;
  double prior_seconds = 0;
  if (opt.resume || opt.start_from) {
    const SafetensorsFile f = opt.start_from ? *opt.start_from : read_safetensors(ckpt);
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
                     {"aux_losses", Json(r.aux_losses).dump()}};
    return snap;
  };
  auto save = [&](int64_t step_done, double seconds) {
    if (ckpt.empty()) return;
    fs::create_directories(opt.out);
    const RunSnapshot snap = capture(step_done, seconds);
    write_safetensors(ckpt, snap.tensors, snap.metadata);
  };

  const int64_t N = corpus.train.size(0);
  double seconds = 0;
  int64_t tokens_now = 0;
  int64_t done = start;
  for (int64_t it = start; it < steps; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor x, y;
    get_batch(corpus.train, pos, B, T, x, y);
    pos = (pos + B * (T + 1)) % N;
    if (dev.is_cuda()) {
      x = x.to(dev);
      y = y.to(dev);
    }
    // The layers see the step (the sparse methods' full-attention warm-up); the evaluations
    // after it run the model as this step trained it.
    model.step = it;
    // The step's rows in micro-batches of MB: each micro-batch's mean loss weighted by MB/B, so the
    // accumulated gradient (and the logged losses) are the whole batch's means.
    double lm_sum = 0, aux_sum = 0;
    bool have_aux = false;
    for (int64_t r0 = 0; r0 < B; r0 += MB) {
      at::Tensor lm_loss;
      ModelAux aux;
      const double w = double(MB) / double(B);
      at::Tensor loss = model_loss(model, MB == B ? x : x.slice(0, r0, r0 + MB), MB == B ? y : y.slice(0, r0, r0 + MB),
                                   backend, &lm_loss, &aux);
      (MB == B ? loss : loss * w).backward();
      lm_sum += w * lm_loss.item<double>();
      if (aux.aux_loss.defined()) {
        aux_sum += w * aux.aux_loss.item<double>();
        have_aux = true;
      }
    }
    r.losses.push_back(lm_sum);
    if (have_aux) r.aux_losses.push_back(aux_sum);
    optim.step(model, it);
    for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens_now += B * T;
    done = it + 1;
    const bool do_eval = done % eval_every == 0 || done == steps;
    if (do_eval) r.val_curve.emplace_back(done, evaluate(model, corpus, B, T, eval_batches, backend, MB));
    if (opt.progress) {
      const double tps = double(tokens_now) / std::max(seconds, 1e-9);
      const double eta = double(steps - done) * double(B * T) / std::max(tps, 1e-9);
      if (opt.progress == 1) {
        Json j = {{"method", r.method}, {"step", done}, {"steps", steps}, {"loss", r.losses.back()},
                  {"lr_mult", lr_multiplier(h.schedule, it)}, {"tok_per_s", tps}, {"eta_s", eta}};
        if (!r.aux_losses.empty()) j["aux_loss"] = r.aux_losses.back();
        if (do_eval) j["val_bpb"] = r.val_curve.back().second;
        std::cout << j.dump() << std::endl;
      } else if (do_eval || done % 10 == 0) {
        std::cout << fmt::format("{} step {}/{}  loss {:.4f}{}{}  {:.0f} tok/s  eta {:.0f}s\n", r.method, done, steps,
                                 r.losses.back(),
                                 r.aux_losses.empty() ? "" : fmt::format("  aux {:.4f}", r.aux_losses.back()),
                                 do_eval ? fmt::format("  val bpb {:.4f}", r.val_curve.back().second) : "", tps, eta)
                  << std::flush;
      }
    }
    const bool stopping = opt.stop_after > 0 && done >= opt.stop_after;
    if (done % ckpt_every == 0 || done == steps || stopping) save(done, prior_seconds + seconds);
    if (stopping) break;
    if (opt.snapshot_out && done == opt.snapshot_at) {
      *opt.snapshot_out = capture(done, prior_seconds + seconds);
      break;
    }
  }
  r.steps_done = done;
  r.tokens = done * B * T;
  r.batch = B;
  r.micro_batch = MB;
  r.seconds = prior_seconds + seconds;
  r.tokens_per_s = tokens_now > 0 ? double(tokens_now) / std::max(seconds, 1e-9) : 0.0;
  if (!r.val_curve.empty()) r.val_bpb = r.val_curve.back().second;
  const int64_t n_probe = opt.probe_sequences >= 0 ? opt.probe_sequences : P.probe_sequences;
  const bool snapshotted = opt.snapshot_out && done == opt.snapshot_at;
  if (corpus.byte_level && n_probe > 0 && !snapshotted) {
    r.probes = evaluate_probes([&](const at::Tensor& idx) { return forward_rows(model, idx.to(dev), backend, MB); }, T,
                               opt.seed, n_probe, corpus.bos);
  }
  return r;
}

Json train_result_json(const TrainResult& r) {
  const ModelDims d = model_dims(r.cfg);
  Json vc = Json::array();
  for (const auto& [s, v] : r.val_curve) vc.push_back({{"step", s}, {r.byte_level ? "bpb" : "bits_per_token", v}});
  return {{"status", "ok"},
          {"method", r.method},
          {"level", "model"},
          {"device", r.device},
          {"threads", r.threads},
          {"dtype", "fp32"},
          {"config", r.cfg.to_json()},
          {"shape", {{"n_layer", d.n_layer}, {"d_model", d.d_model}, {"n_head", d.n_head}, {"head_dim", d.head_dim},
                     {"seq_len", d.seq_len}, {"vocab", d.vocab}}},
          {r.byte_level ? "val_bpb" : "val_bits_per_token", r.val_bpb},
          {"steps", r.steps_done},
          {"budget", r.budget.to_json()},
          {"batch", r.batch},
          {"micro_batch", r.micro_batch},
          {"tokens", r.tokens},
          {"seconds", r.seconds},
          {"tokens_per_s", r.tokens_per_s},
          {"train_flops_per_token_nanochat", r.cost.train_flops_nanochat},
          {"params", {{"total", r.cost.params.total()}, {"matmul", r.cost.params.matmul}}},
          {"loss_curve", r.losses},
          {"aux_loss_curve", r.aux_losses},
          {"val_curve", vc},
          {"probes", r.probes.is_null() ? Json::object() : r.probes}};
}

}  // namespace mixbench
