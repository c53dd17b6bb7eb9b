#include "suites/tasks.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <tuple>

#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/tf32_scope.h"
#include "suites/optimizer.h"
#include "suites/step_graph.h"
#include "suites/sweep_measure.h"
#include "suites/train_presets.h"

namespace mixbench {

using Json = nlohmann::json;

// ------------------------------------------------------------------ presets
TasksPreset tasks_preset(const std::string& name) {
  TasksPreset p;
  p.name = name;
  if (name == "cpu-tiny") {
    p.about = "CI on the CPU: 3 methods x 4 settings x 1 seed in under 3 minutes on 2 cores";
    p.lineup = train_presets_table().at("tiny").at("tasks_lineup").get<std::vector<std::string>>();
    p.tasks = {"mqar", "in_context_recall", "parity"};
    p.seeds = 1;
    p.steps = 150;
    p.batch = 32;
    p.lr = 3e-3;
    p.eval_instances = 128;
    p.cpu_threads = 1;
    p.mqar_lengths = {32};
    p.mqar_pairs = {2, 4};
    p.mqar_widths = {64};
    p.mqar_vocab = 16;
    p.mad_length = 32;
    p.mad_width = 64;
    p.state_length = 8;
    p.state_width = 64;
  } else if (name == "gpu") {
    p.about = "one GPU: the full grid, every registered method, 3 seeds";
    for (const auto& t : task_infos()) p.tasks.push_back(t.name);
  } else {
    throw UsageError(fmt::format("unknown tasks preset '{}' (known: cpu-tiny, gpu)", name));
  }
  return p;
}

std::vector<TaskSetting> task_grid(const TasksPreset& p, const std::vector<std::string>& tasks) {
  std::vector<TaskSetting> grid;
  for (const auto& t : tasks.empty() ? p.tasks : tasks) {
    const TaskInfo& info = task_info(t);
    auto add = [&](int64_t length, int64_t d, int64_t pairs = 0, int64_t vocab = 0) {
      TaskSetting s{t, length, pairs, d, vocab, {length}};
      if (!p.test_scales.empty()) {
        s.test_lengths.clear();
        for (int64_t k : p.test_scales) s.test_lengths.push_back(k * length);
      } else if (info.length_generalisation) {
        s.test_lengths = {length, 2 * length, 4 * length};
      }
      check_task_setting(s);
      grid.push_back(s);
    };
    if (t == "mqar") {
      for (int64_t L : p.mqar_lengths)
        for (int64_t n : p.mqar_pairs)
          if (4 * n <= L)
            for (int64_t d : p.mqar_widths) add(L, d, n, p.mqar_vocab);
    } else if (info.length_generalisation) {
      add(p.state_length, p.state_width);
    } else if (t == "selective_copy") {
      add(2 * p.mad_length, p.mad_width);
    } else if (t == "compression" || t == "memorization") {
      add(p.mad_length / 4, p.mad_width);
    } else {
      add(p.mad_length, p.mad_width);
    }
  }
  return grid;
}

std::string task_model_config(const MethodSpec& method, const TasksPreset& p, const TaskSetting& s) {
  std::string cfg = fmt::format("n_layer={},d_model={},head_dim={},seq_len={},vocab={}", p.n_layer, s.d_model,
                                std::min(p.head_dim, s.d_model), task_model_seq_len(s), task_vocab(s) + 1);
  auto it = method.presets.find("tiny");
  if (it != method.presets.end() && !it->second.config.empty()) cfg += "," + it->second.config;
  if (!p.config.empty()) cfg += "," + p.config;
  return cfg;
}

std::vector<std::string> tasks_methods(const TasksPreset& p, const std::vector<std::string>& methods) {
  std::vector<std::string> out = methods;
  if ((methods.size() == 1 && methods[0] == "all") || (methods.empty() && p.lineup.empty())) {
    out.clear();
    for (const auto* m : Registry::get().methods()) out.push_back(m->name);
  } else if (methods.empty()) {
    out = p.lineup;
  }
  for (const auto& m : out) Registry::get().method(m);  // UsageError with suggestions
  return out;
}

void task_batch(const std::vector<ProbeSeq>& seqs, int64_t T, int64_t bos, at::Tensor& idx, at::Tensor& targets) {
  const int64_t N = int64_t(seqs.size());
  idx = at::full({N, T}, bos, at::TensorOptions().dtype(at::kLong));
  targets = at::full({N, T}, -1, at::TensorOptions().dtype(at::kLong));
  auto xi = idx.accessor<int64_t, 2>();
  auto yi = targets.accessor<int64_t, 2>();
  for (int64_t b = 0; b < N; ++b) {
    const auto& s = seqs[size_t(b)];
    if (int64_t(s.tokens.size()) + 1 > T)
      throw InputError(fmt::format("an instance of {} tokens does not fit {} columns with its BOS", s.tokens.size(), T));
    for (size_t t = 0; t < s.tokens.size(); ++t) xi[b][int64_t(t) + 1] = s.tokens[t];
    // column p (the prefix up to token p − 1, BOS first) predicts token p
    for (int64_t p : s.answer_pos) yi[b][p] = s.tokens[size_t(p)];
  }
}

// ------------------------------------------------------------------ training
namespace {
void check_graph_mode(const std::string& graph) {
  if (graph != "auto" && graph != "off") throw UsageError(fmt::format("--graph {}: takes auto or off", graph));
}
}  // namespace

TaskTraining train_task(const MethodSpec& method, const Config& cfg, const TaskSetting& s, const TasksPreset& P,
                        uint64_t seed, int64_t steps, const std::string& device, const std::string& graph_mode) {
  check_graph_mode(graph_mode);
  const bool cuda = device == "cuda";
  const at::Device dev = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const Backend backend = cuda ? Backend::CUDA : Backend::CPU;
  const int64_t bos = task_vocab(s);
  TaskTraining out;
  Model& model = out.model;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  model = build_model(method, cfg, gen, at::TensorOptions().dtype(at::kFloat));
  std::vector<std::string> names;
  for (const auto& [n, t] : model.params) names.push_back(n);
  for (const auto& n : names) {
    at::Tensor p = model.params.at(n).to(dev);
    p.requires_grad_(true);
    model.params.set(n, p);
  }
  PlainAdamW adamw(model, 0.9, 0.999, 1e-8, P.weight_decay);
  Schedule sched;
  sched.steps = steps;
  sched.warmup = std::max<int64_t>(1, steps / 10);
  sched.warmdown_ratio = 0.2;
  auto clear_grads = [&] {
    for (const auto& [n, p] : model.params) p.mutable_grad() = at::Tensor();
  };

  // The graph (suites/step_graph.h): captured at the first step after the first whose layers do not
  // depend on the step, then replayed. Every step of a run that wants one, the eager ones too, reads
  // the AdamW values from the device buffer: the same kernels as the replays.
  const bool graph_wanted = cuda && graph_mode == "auto";
  out.graph_reason = !cuda ? "not on a GPU" : !graph_wanted ? "--graph off" : "";
#if !defined(MIXBENCH_WITH_CUDA)
  if (graph_wanted) out.graph_reason = "built without CUDA";
#endif
  if (graph_wanted) adamw.use_device_scalars();
  StepGraph graph;
  at::Tensor graph_x, graph_y, graph_lm;  // the static batch and loss the graph reads and writes
  std::string dependence;                 // why the last uncaptured step ran eagerly
  int64_t captured_at = -1;
  auto capture = [&](const at::Tensor& x, const at::Tensor& y) {
    graph_x = x.to(dev);
    graph_y = y.to(dev);
    // a warm-up pass on the capture stream (its gradients are discarded), then the capture
    graph.warm_up([&] { model_loss(model, graph_x, graph_y, backend).backward(); });
    clear_grads();
    const std::string failed = graph.capture(
        [&] {
          at::Tensor lm;
          model_loss(model, graph_x, graph_y, backend, &lm).backward();
          graph_lm = lm.detach();
          adamw.apply(model);
        },
        [&] {
          graph_lm = at::Tensor();
          clear_grads();
        });
    if (!failed.empty()) out.graph_reason = "capture failed: " + failed;
    sweep_detail::sync_device(device);
  };

  // Losses stay on the device until the end on a GPU (reading one synchronises the host with it).
  at::Tensor loss_log;
  const auto t0 = std::chrono::steady_clock::now();
  auto steady_t0 = t0;
  int64_t steady_from = 0;
  for (int64_t it = 0; it < steps; ++it) {
    std::vector<ProbeSeq> seqs;
    for (int64_t b = 0; b < P.batch; ++b)
      seqs.push_back(task_instance(s, seed, TaskSplit::Train, it * P.batch + b, s.length));
    size_t longest = 0;
    for (const auto& q : seqs) longest = std::max(longest, q.tokens.size());
    at::Tensor x, y;
    task_batch(seqs, int64_t(longest) + 1, bos, x, y);
    if (cuda) {  // page-locked: the copies to the device are asynchronous
      x = x.pin_memory();
      y = y.pin_memory();
    }
    model.step = it;
    const double lr = P.lr * lr_multiplier(sched, it);
    if (graph_wanted && !graph.held() && out.graph_reason.empty() && it > 0) {
      dependence = step_dependence(model, it);
      if (dependence.empty()) {
        capture(x, y);
        captured_at = it;
      }
    }
    if (graph.held() && x.sizes() != graph_x.sizes()) {
      // every training instance of a setting has its length, so this does not happen; if it did, the
      // graph could not hold the step: eager from here
      out.graph_reason = fmt::format("a batch of shape [{}, {}] after the graph captured [{}, {}]", x.size(0),
                                     x.size(1), graph_x.size(0), graph_x.size(1));
      graph.reset();
      graph_lm = at::Tensor();
      clear_grads();
    }
    at::Tensor lm;
    if (graph.held()) {
      graph_x.copy_(x, /*non_blocking=*/true);
      graph_y.copy_(y, /*non_blocking=*/true);
      adamw.write_scalars(it, lr);  // this step's values, before the replay reads them
      graph.replay();
      lm = graph_lm;
    } else {
      model_loss(model, x.to(dev, /*non_blocking=*/cuda), y.to(dev, /*non_blocking=*/cuda), backend, &lm).backward();
      if (!cuda) out.losses.push_back(lm.item<double>());
      adamw.step(model, it, lr);
      clear_grads();
    }
    if (cuda) {
      if (!loss_log.defined()) loss_log = at::empty({steps}, lm.options());
      loss_log.select(0, it).copy_(lm.detach());
    }
    // the steady rate starts after the first step and after the capture (one-time work)
    if (it == 0 || it == captured_at) {
      sweep_detail::sync_device(device);
      steady_t0 = std::chrono::steady_clock::now();
      steady_from = it + 1;
    }
  }
  sweep_detail::sync_device(device);
  const auto t1 = std::chrono::steady_clock::now();
  out.seconds = std::chrono::duration<double>(t1 - t0).count();
  const int64_t steady_steps = steps - steady_from;
  const double steady_seconds = std::chrono::duration<double>(t1 - steady_t0).count();
  out.steps_per_s = steady_steps > 0 ? double(steady_steps) / std::max(steady_seconds, 1e-9)
                                     : double(steps) / std::max(out.seconds, 1e-9);
  if (loss_log.defined()) {
    at::Tensor h = loss_log.to(at::kDouble).cpu();
    for (int64_t k = 0; k < h.size(0); ++k) out.losses.push_back(h[k].item<double>());
  }
  out.graph = graph.held();
  if (!out.graph && out.graph_reason.empty())
    out.graph_reason = !dependence.empty() ? "no step was captured: " + dependence
                                           : "no step was captured: the run has no step after its first";
  if (graph.held()) {  // the graph's memory goes back before the evaluation
    graph.reset();
    graph_lm = at::Tensor();
    clear_grads();
  }
  return out;
}

// ------------------------------------------------------------------ runs
namespace {

struct Run {
  const MethodSpec* method;
  const TaskSetting* setting;
  uint64_t seed;
};

Json row_head(const Run& r, int64_t test_length, const std::string& status) {
  return {{"status", status},       {"method", r.method->name}, {"task", r.setting->task},
          {"setting", r.setting->to_json(test_length)},        {"label", r.setting->label(test_length)},
          {"seed", r.seed},         {"chance", task_chance(*r.setting)}};
}

// Trains one model on the setting and scores it at every held-out length: one row per length.
std::vector<Json> run_one(const Run& r, const TasksPreset& P, int64_t steps, const std::string& device,
                          const std::string& graph) {
  const TaskSetting& s = *r.setting;
  const MethodSpec& ms = *r.method;
  std::vector<Json> rows;
  auto all_rows = [&](const std::string& status, const std::string& key, const std::string& text) {
    rows.clear();
    for (int64_t tl : s.test_lengths) rows.push_back(row_head(r, tl, status));
    for (auto& row : rows) row[key] = text;
    return rows;
  };
  Config cfg;
  try {
    // a sparse method's full-attention warm-up in steps, from its fraction of the run (as the trainer)
    cfg = resolve_full_attention_warmup(ms.config.parse(task_model_config(ms, P, s)), steps);
  } catch (const InputError& e) {
    return all_rows("skipped", "reason", fmt::format("config refused: {}", e.what()));
  }
  const bool cuda = device == "cuda";
  const at::Device dev = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const Backend backend = cuda ? Backend::CUDA : Backend::CPU;
  const int64_t bos = task_vocab(s);
  TaskTraining tr;
  try {
    tr = train_task(ms, cfg, s, P, r.seed, steps, device, graph);
    for (int64_t tl : s.test_lengths) {
      std::vector<ProbeSeq> held;
      for (int64_t i = 0; i < P.eval_instances; ++i) held.push_back(task_instance(s, r.seed, TaskSplit::HeldOut, i, tl));
      const ProbeScore sc = score_probes(
          held, [&](const at::Tensor& idx) { return model_forward(tr.model, idx.to(dev), backend); }, bos, 64);
      Json row = row_head(r, tl, "ok");
      row["accuracy"] = sc.accuracy;
      row["exact"] = sc.exact;
      row["answers"] = sc.answers;
      row["instances"] = sc.sequences;
      rows.push_back(row);
    }
  } catch (const InputError& e) {
    return all_rows("skipped", "reason", e.what());
  } catch (const UsageError&) {
    throw;
  } catch (const c10::Error& e) {  // e.g. CUDA out of memory: the message, not LibTorch's backtrace
    return all_rows("error", "message", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return all_rows("error", "message", e.what());
  }
  for (auto& row : rows) {
    row["steps"] = steps;
    row["batch"] = P.batch;
    row["seconds"] = tr.seconds;
    row["steps_per_s"] = tr.steps_per_s;
    row["final_loss"] = tr.losses.empty() ? 0.0 : tr.losses.back();
    row["cuda_graph"] = tr.graph;
    row["cuda_graph_reason"] = tr.graph_reason;
    row["device"] = device;
    row["config"] = cfg.to_json();
  }
  return rows;
}
}  // namespace

Json run_tasks(const TasksOptions& o) {
  TasksPreset P = tasks_preset(o.preset);
  for (auto [given, grid, what] : {std::tuple{&o.mqar_lengths, &P.mqar_lengths, "--lengths"},
                                   std::tuple{&o.mqar_pairs, &P.mqar_pairs, "--pairs"},
                                   std::tuple{&o.mqar_widths, &P.mqar_widths, "--widths"}}) {
    for (int64_t v : *given)
      if (v < 1) throw UsageError(fmt::format("{} takes positive integers, not {}", what, v));
    if (!given->empty()) *grid = *given;
  }
  if (o.mqar_vocab < 0) throw UsageError(fmt::format("--vocab takes a positive integer, not {}", o.mqar_vocab));
  if (o.mqar_vocab > 0) P.mqar_vocab = o.mqar_vocab;
  for (int64_t k : o.test_scales)
    if (k < 1) throw UsageError(fmt::format("--test-scales takes positive multiples of the training length, not {}", k));
  if (!o.test_scales.empty()) P.test_scales = o.test_scales;
  P.config = o.config;
  const std::vector<std::string> methods = tasks_methods(P, o.methods);
  // A bad override is the user's mistake, not a method's refusal of a setting: check it on every
  // method's config spec before training anything.
  if (!P.config.empty())
    for (const auto& m : methods) {
      const MethodSpec& ms = Registry::get().method(m);
      try {
        ms.config.parse(P.config);
      } catch (const InputError& e) {
        throw UsageError(fmt::format("--config '{}' for {}: {}", P.config, m, e.what()));
      }
    }
  const std::vector<TaskSetting> grid = task_grid(P, o.tasks);
  if (grid.empty())
    throw UsageError("the grid is empty: no MQAR (length, pairs) with 4 x pairs <= length, and no other task");
  const int64_t seeds = o.seeds > 0 ? o.seeds : P.seeds;
  const int64_t steps = o.steps > 0 ? o.steps : P.steps;
  if (o.lr < 0) throw UsageError(fmt::format("--lr must be positive, not {}", o.lr));
  if (o.lr > 0) P.lr = o.lr;
  if (o.device != "cpu" && o.device != "cuda") throw UsageError(fmt::format("unknown device '{}' (cpu or cuda)", o.device));
  if (o.device == "cuda" && !at::hasCUDA()) throw UsageError("--device cuda: no CUDA device is available");
  check_graph_mode(o.graph);
  const Tf32Scope tf32(o.device == "cuda");
  const int saved_threads = at::get_num_threads();
  if (o.device == "cpu" && P.cpu_threads > 0) at::set_num_threads(P.cpu_threads);
  Json results = Json::array();
  try {
    for (const auto& s : grid)
      for (const auto& m : methods)
        for (int64_t k = 0; k < seeds; ++k) {
          const Run r{&Registry::get().method(m), &s, o.seed + uint64_t(k)};
          for (Json& row : run_one(r, P, steps, o.device, o.graph)) {
            if (o.progress == 1) {
              std::cout << Json{{"method", m}, {"setting", row["label"]}, {"seed", r.seed}, {"status", row["status"]},
                                {"accuracy", row.value("accuracy", Json())}}.dump()
                        << std::endl;
            } else if (o.progress == 2) {
              std::cout << fmt::format("{:<16} {:<40} seed {}  {}\n", m, row["label"].get<std::string>(), r.seed,
                                       row["status"] == "ok"
                                           ? fmt::format("accuracy {:.3f} ({:.1f}s, {:.0f} steps/s{})",
                                                         row["accuracy"].get<double>(), row["seconds"].get<double>(),
                                                         row["steps_per_s"].get<double>(),
                                                         row["cuda_graph"].get<bool>() ? ", CUDA graph" : "")
                                           : row["status"].get<std::string>())
                        << std::flush;
            }
            results.push_back(std::move(row));
          }
        }
  } catch (...) {
    at::set_num_threads(saved_threads);
    throw;
  }
  at::set_num_threads(saved_threads);
  return results;
}

}  // namespace mixbench
