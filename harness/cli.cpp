#include "harness/cli.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <iostream>
#include <filesystem>
#include <unistd.h>

#include "harness/args.h"
#include "harness/backbone.h"
#include "harness/errors.h"
#include "harness/flop_counter.h"
#include "harness/io.h"
#include "harness/metrics.h"
#include "harness/registry.h"
#include "harness/report.h"
#include "harness/safetensors.h"
#include "reports/plot.h"
#include "suites/conformance.h"
#include "harness/cli/sweep_args.h"
#include "suites/train.h"
#include "suites/train_eval.h"

namespace mixbench {

namespace {

using Json = nlohmann::json;

const char* kUsage = R"(mixbench — conformance, accounting and benchmarks for sequence mixers

usage: mixbench <command> [options]

commands:
  list          [--json]                          registered methods and ops, and which parts exist
  conformance   [--methods a,b|all] [--ops x,y|all] [--device cpu|cuda] [--dtype fp64|fp32|bf16]
                [--golden FILE...] [--seed N] [--no-fd] [--out report.json]
                optimized paths against FP64 references; exit 0 all pass, 1 a case failed
  account       --method NAME [--seq-len T] [--context C] [--config k=v,...] [--audit] [--json] [--out FILE]
                parameters, FLOPs/token, decode FLOPs, activation and cache bytes
  golden        --op NAME [--config k=v,...] [--batch B] [--seq-len T] [--seed N] --out FILE.safetensors
                write a golden file from the FP64 reference (inputs, outputs, cotangents, gradients)
  sweep         --mode prefill|decode|train [--methods a,b|all] [--level op|layer|model] [--batch 1,2,4,8]
                [--lengths 1k:1m | 256,512,...] [--device cpu|cuda] [--dtype bf16|fp32|fp64] [--preset NAME]
                [--config k=v,...] [--reps N] [--warmup N] [--memory-limit BYTES|2G] [--out FILE]
                throughput and OOM grid (presets cpu-tiny, the default, and gpu-d12); oom points are results
  train         --method NAME [--preset tiny|small] [--steps N] [--batch B] [--micro-batch M] [--seed S]
                [--data synthetic|PATH]
                [--config k=v,...] [--out DIR] [--resume] [--eval-every N] [--stop-after N]
                [--device cpu|cuda] [--probes N]
                Muon/AdamW training; progress as JSON lines when stdout is not a terminal;
                DIR/checkpoint.safetensors (atomic) and DIR/train.json; capability probes
                (MQAR, NIAH single-1/2/3, S3/S5 state tracking) on N held-out sequences each
  leaderboard   [--preset tiny|small] [--methods a,b|all] [--steps N] [--batch B] [--micro-batch M] [--seed S]
                [--data synthetic|PATH] [--config k=v,...] [--device cpu|cuda] [--probes N] [--out report.json]
                equal-FLOP ranking: each method's shape calibrated to dense's FLOPs/token (±2%);
                the Markdown table (.md) and an HTML page (.html, inline SVG) beside the report
  plot          FILE --out page.html              offline HTML page (inline SVG) of a sweep report
  report        FILE                              Markdown summary of a report
  validate      FILE                              check a report against reports/report.schema.json
)";

RunInfo run_info(const std::string& kind, const std::vector<std::string>& args) {
  RunInfo info;
  info.kind = kind;
  info.argv = {"mixbench"};
  info.argv.insert(info.argv.end(), args.begin(), args.end());
  return info;
}

Backend parse_device(const std::string& d) {
  if (d == "cpu") return Backend::CPU;
  if (d == "cuda") return Backend::CUDA;
  throw UsageError(fmt::format("unknown device '{}' (use cpu or cuda)", d));
}

// ------------------------------------------------------------------ list
int cmd_list(const std::vector<std::string>& args) {
  Args a(args, {}, {"json"});
  Registry& reg = Registry::get();
  Json j = {{"methods", Json::array()}, {"ops", Json::array()}};
  for (const MethodSpec* m : reg.methods()) {
    bool cuda_ops = true;
    for (const auto& o : m->ops) cuda_ops = cuda_ops && reg.has_op(o) && bool(reg.op(o).cuda);
    j["methods"].push_back({{"name", m->name}, {"family", m->family}, {"summary", m->summary},
                            {"citation", m->citation}, {"ops", m->ops}, {"reference", bool(m->reference)},
                            {"cpu", bool(m->forward)}, {"cuda", m->has_cuda && cuda_ops},
                            {"accountant", bool(m->account)}});
    if (m->is_hybrid()) {  // the layout at the method's default depth
      Json lay = Json::array();
      for (const auto& ch : m->layout(m->config.defaults())) lay.push_back(ch.method);
      j["methods"].back()["layer_mixers"] = lay;
    }
  }
  for (const OpSpec* o : reg.ops())
    j["ops"].push_back({{"name", o->name}, {"family", o->family}, {"summary", o->summary}, {"citation", o->citation},
                        {"reference", bool(o->reference)}, {"cpu", bool(o->cpu)}, {"cuda", bool(o->cuda)},
                        {"inputs", [&] { Json x = Json::array(); for (auto& d : o->inputs) x.push_back(d.name); return x; }()},
                        {"outputs", o->outputs}});
  if (a.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  auto yn = [](bool b) { return b ? "yes" : "-"; };
  std::cout << fmt::format("{:<16} {:<12} {:<5} {:<5} {:<5} {:<5}  {}\n", "method", "family", "ref", "cpu", "cuda", "acct", "summary");
  for (const auto& m : j["methods"])
    std::cout << fmt::format("{:<16} {:<12} {:<5} {:<5} {:<5} {:<5}  {}\n", m["name"].get<std::string>(),
                             m["family"].get<std::string>(), yn(m["reference"]), yn(m["cpu"]), yn(m["cuda"]),
                             yn(m["accountant"]), m["summary"].get<std::string>());
  std::cout << "\n" << fmt::format("{:<22} {:<12} {:<5} {:<5} {:<5}  {}\n", "op", "family", "ref", "cpu", "cuda", "summary");
  for (const auto& o : j["ops"])
    std::cout << fmt::format("{:<22} {:<12} {:<5} {:<5} {:<5}  {}\n", o["name"].get<std::string>(),
                             o["family"].get<std::string>(), yn(o["reference"]), yn(o["cpu"]), yn(o["cuda"]),
                             o["summary"].get<std::string>());
  return 0;
}

// ------------------------------------------------------------------ conformance
void print_conformance_table(const Json& results) {
  struct Row {
    int pass = 0, fail = 0, other = 0;
    double worst = 0;
  };
  std::map<std::string, Row> rows;
  for (const auto& r : results) {
    std::string key = fmt::format("{:<14} {:<18} {:<7} {:<5} {:<5}", r.value("method", Json()).is_null() ? "-" : r["method"].get<std::string>(),
                                  !r.value("op", Json()).is_null() ? r["op"].get<std::string>()
                                  : r.contains("layer_mixers") ? "model" : "layer",
                                  r.value("level", std::string("?")), r.value("device", std::string("?")),
                                  r.value("dtype", std::string("?")));
    Row& row = rows[key];
    std::string st = r["status"];
    if (st == "pass") ++row.pass;
    else if (st == "fail") ++row.fail;
    else ++row.other;
    if (r.contains("checks"))
      for (const auto& c : r["checks"])
        if (!c["rel_rms"].is_null()) {
          // threshold 0 (selection checks): any error is infinitely over it
          const double e = c["rel_rms"].get<double>(), t = c["threshold"].get<double>();
          row.worst = std::max(row.worst, t > 0 ? e / t : (e > 0 ? INFINITY : 0.0));
        }
  }
  std::cout << fmt::format("{:<14} {:<18} {:<7} {:<5} {:<5} {:>5} {:>5} {:>6} {:>12}\n", "method", "op", "level", "dev",
                           "dtype", "pass", "fail", "other", "worst/thr");
  for (const auto& [k, r] : rows)
    std::cout << fmt::format("{} {:>5} {:>5} {:>6} {:>12.3g}\n", k, r.pass, r.fail, r.other, r.worst);
}

int cmd_conformance(const std::vector<std::string>& args) {
  Args a(args, {"device", "dtype", "seed", "out", "inject-fault"}, {"no-fd", "quiet"}, {"methods", "ops", "golden"});
  Registry& reg = Registry::get();
  ConformanceOptions opt;
  opt.backend = parse_device(a.get_or("device", "cpu"));
  opt.dtype = a.get_or("dtype", "fp64");
  parse_dtype(opt.dtype);
  opt.seed = uint64_t(a.get_int("seed", 1234));
  opt.finite_differences = !a.flag("no-fd");
  opt.goldens = a.list("golden");
  opt.fault = a.get_or("inject-fault", "");
  if (!opt.fault.empty() && opt.fault != "output" && opt.fault != "gradient")
    throw UsageError("--inject-fault takes 'output' or 'gradient'");
  auto methods = a.list("methods");
  auto ops = a.list("ops");
  const bool none_given = methods.empty() && ops.empty() && opt.goldens.empty();
  if ((methods.size() == 1 && methods[0] == "all") || none_given) {
    methods.clear();
    for (auto* m : reg.methods()) methods.push_back(m->name);
  }
  if ((ops.size() == 1 && ops[0] == "all") || none_given) {
    ops.clear();
    for (auto* o : reg.ops()) ops.push_back(o->name);
  }
  for (const auto& m : methods) reg.method(m);  // unknown names fail before any work
  for (const auto& o : ops) reg.op(o);
  if (ops.empty()) {  // the ops the selected methods call
    std::set<std::string> used;
    for (const auto& m : methods)
      for (const auto& o : reg.method(m).ops) used.insert(o);
    ops.assign(used.begin(), used.end());
  }
  opt.methods = methods;
  opt.ops = ops;
  ConformanceSummary sum;
  Json results = run_conformance(opt, sum);
  RunInfo info = run_info("conformance", args);
  info.config = {{"methods", methods}, {"ops", ops}, {"device", a.get_or("device", "cpu")}, {"dtype", opt.dtype},
                 {"goldens", opt.goldens}, {"finite_differences", opt.finite_differences}, {"fault", opt.fault}};
  info.seeds = {{"base", opt.seed}};
  Json report = make_report(info, results);
  report["thresholds"] = threshold_table();
  report["summary"] = {{"passed", sum.passed}, {"failed", sum.failed}, {"skipped", sum.skipped}, {"errors", sum.errors}};
  if (auto out = a.get("out")) write_report(*out, report);
  if (!a.flag("quiet")) print_conformance_table(results);
  std::cout << fmt::format("conformance: {} passed, {} failed, {} skipped, {} errors\n", sum.passed, sum.failed,
                           sum.skipped, sum.errors);
  return (sum.failed == 0 && sum.errors == 0) ? 0 : 1;
}

// ------------------------------------------------------------------ account
Json param_json(const ParamCount& p) {
  return {{"wte", p.wte},         {"value_embeds", p.value_embeds}, {"lm_head", p.lm_head},
          {"transformer_matrices", p.transformer_matrices}, {"scalars", p.scalars},
          {"total", p.total()},   {"matmul", p.matmul}};
}

int cmd_account(const std::vector<std::string>& args) {
  Args a(args, {"method", "seq-len", "context", "config", "out", "dtype-bytes", "batch"}, {"json", "audit"});
  auto name = a.get("method");
  if (!name) throw UsageError("account needs --method NAME");
  const MethodSpec& m = Registry::get().method(*name);
  std::string overrides = a.get_or("config", "");
  if (auto T = a.get("seq-len")) overrides += (overrides.empty() ? "" : ",") + std::string("seq_len=") + *T;
  Config cfg = m.config.parse(overrides);
  CostQuery q;
  q.T = cfg.i("seq_len");
  q.context = a.get_int("context", q.T);
  q.dtype_bytes = a.get_int("dtype-bytes", 2);
  ModelCost mc = account_model(m, cfg, q);
  ModelDims d = model_dims(cfg);
  Json r = {{"status", "ok"},
            {"method", m.name},
            {"config", cfg.to_json()},
            {"shape", {{"n_layer", d.n_layer}, {"d_model", d.d_model}, {"n_head", d.n_head}, {"head_dim", d.head_dim},
                       {"seq_len", q.T}, {"context", q.context}, {"vocab", d.vocab}}},
            {"params", param_json(mc.params)},
            {"train_flops_per_token_nanochat", mc.train_flops_nanochat},
            {"fwd_flops_per_token", mc.fwd_flops},
            {"decode_flops_per_token", mc.decode_flops},
            {"activation_bytes_per_token", mc.act_bytes},
            {"kv_cache_bytes_per_token", mc.cache_bytes_per_token},
            {"state_bytes_per_sequence", mc.state_bytes},
            {"dtype_bytes", q.dtype_bytes}};
  Json layers = Json::array();
  const std::vector<LayerMethod> lm = layer_methods(m, cfg);
  for (size_t i = 0; i < mc.layers.size(); ++i)
    layers.push_back({{"layer", i}, {"method", lm[i].method->name}, {"params", mc.layers[i].params.total()},
                      {"fwd_flops", mc.layers[i].fwd_flops}, {"nanochat_core_flops", mc.layers[i].nanochat_core_flops},
                      {"formula", mc.layers[i].formula}});
  r["layers"] = layers;
  if (a.flag("audit")) {
    // Build the model and count what it holds and executes.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
    Model model = build_model(m, cfg, gen, at::TensorOptions().dtype(at::kFloat), true);
    ParamCount built = count_params(model);
    const int64_t B = a.get_int("batch", 1);
    at::Tensor idx = at::randint(d.vocab, {B, q.T}, gen, at::TensorOptions().dtype(at::kLong));
    double counted = 0;
    {
      c10::NoGradGuard ng;
      FlopCounter fc;
      model_forward(model, idx, Backend::CPU);
      counted = fc.total() / double(B * q.T) + mc.uncounted_flops;
    }
    r["audit"] = {{"params_built", param_json(built)},
                  {"params_match", built.total() == mc.params.total() && built.matmul == mc.params.matmul &&
                                       built.transformer_matrices == mc.params.transformer_matrices},
                  {"fwd_flops_counted_per_token", counted},
                  {"fwd_flops_documented_uncounted_per_token", mc.uncounted_flops},
                  {"fwd_flops_rel_diff", std::abs(counted - mc.fwd_flops) / mc.fwd_flops}};
  }
  RunInfo info = run_info("account", args);
  info.config = cfg.to_json();
  Json report = make_report(info, Json::array({r}));
  if (auto out = a.get("out")) write_report(*out, report);
  if (a.flag("json")) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::cout << fmt::format("method {}  (L={}, d={}, H={}, dh={}, T={}, vocab={})\n", m.name, d.n_layer, d.d_model,
                             d.n_head, d.head_dim, q.T, d.vocab);
    std::cout << fmt::format("params: total {}  (wte {}, value_embeds {}, lm_head {}, transformer_matrices {}, scalars {}; matmul {})\n",
                             mc.params.total(), mc.params.wte, mc.params.value_embeds, mc.params.lm_head,
                             mc.params.transformer_matrices, mc.params.scalars, mc.params.matmul);
    std::cout << fmt::format("training FLOPs/token (nanochat: 6·N_matmul + Σ core): {:.4e}\n", mc.train_flops_nanochat);
    std::cout << fmt::format("forward FLOPs/token (executed, causal pairs exact):   {:.4e}\n", mc.fwd_flops);
    std::cout << fmt::format("decode FLOPs/token at context {}:                    {:.4e}\n", q.context, mc.decode_flops);
    std::cout << fmt::format("activation bytes/token: {:.4g}   KV cache bytes/token: {:.4g}   fixed state bytes: {:.4g}\n",
                             mc.act_bytes, mc.cache_bytes_per_token, mc.state_bytes);
    if (r.contains("audit"))
      std::cout << fmt::format("audit: built params {} ({}), counted fwd FLOPs/token {:.4e} (rel diff {:.2e})\n",
                               r["audit"]["params_built"]["total"].get<int64_t>(),
                               r["audit"]["params_match"].get<bool>() ? "match" : "MISMATCH",
                               r["audit"]["fwd_flops_counted_per_token"].get<double>(),
                               r["audit"]["fwd_flops_rel_diff"].get<double>());
  }
  if (r.contains("audit") && (!r["audit"]["params_match"].get<bool>() || r["audit"]["fwd_flops_rel_diff"].get<double>() > 0.02))
    return 1;
  return 0;
}

// ------------------------------------------------------------------ golden
int cmd_golden(const std::vector<std::string>& args) {
  Args a(args, {"op", "config", "batch", "seq-len", "seed", "out", "dtype"});
  auto op = a.get("op");
  auto out = a.get("out");
  if (!op || !out) throw UsageError("golden needs --op NAME and --out FILE");
  const OpSpec& spec = Registry::get().op(*op);
  Config cfg = spec.params.parse(a.get_or("config", ""));
  const int64_t B = a.get_int("batch", 2), T = a.get_int("seq-len", 33);
  if (B < 1 || T < 1) throw UsageError("--batch and --seq-len must be positive");
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(a.get_int("seed", 0)));
  TensorMap in = spec.make_inputs(cfg, B, T, gen);
  std::vector<at::Tensor> diff;
  std::vector<std::string> names;
  for (const auto& [n, t] : in) {
    bool d = at::isFloatingType(t.scalar_type());
    for (const auto& def : spec.inputs)
      if (def.name == n) d = d && def.differentiable;
    if (d) {
      t.requires_grad_(true);
      diff.push_back(t);
      names.push_back(n);
    }
  }
  TensorMap outs = spec.reference(in, cfg);
  TensorMap file;
  for (const auto& [n, t] : in) file.set(n, t.detach());
  at::Tensor loss;
  for (const auto& [n, o] : outs) {
    file.set(n, o.detach());
    if (!at::isFloatingType(o.scalar_type())) continue;
    at::Tensor d = at::randn(o.sizes(), gen, o.options().requires_grad(false));
    file.set("d" + n, d);
    loss = loss.defined() ? loss + (o * d).sum() : (o * d).sum();
  }
  if (loss.defined() && !diff.empty()) {
    auto g = torch::autograd::grad({loss}, diff, {}, false, false, true);
    for (size_t i = 0; i < g.size(); ++i) file.set("grad_" + names[i], g[i].defined() ? g[i] : at::zeros_like(diff[i]));
  }
  std::map<std::string, std::string> meta = {{"op", spec.name}};
  for (const auto& f : spec.params.fields()) {
    const auto& v = cfg.values().at(f.name);
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, std::string>) meta[f.name] = x;
      else if constexpr (std::is_same_v<T, bool>) meta[f.name] = x ? "true" : "false";
      else if constexpr (std::is_same_v<T, double>) meta[f.name] = fmt::format("{:.17g}", x);
      else meta[f.name] = std::to_string(x);
    }, v);
  }
  if (cfg.f("scale") == 0.0 && spec.params.find("scale") && in.has("q"))
    meta["scale"] = fmt::format("{:.17g}", 1.0 / std::sqrt(double(in.at("q").size(-1))));
  write_safetensors(*out, file, meta);
  std::cout << fmt::format("wrote {} ({} tensors)\n", *out, file.size());
  return 0;
}

// ------------------------------------------------------------------ sweep
int cmd_sweep(const std::vector<std::string>& args) {
  Args a(args, {"mode", "level", "batch", "lengths", "device", "dtype", "preset", "config", "reps", "warmup",
                "memory-limit", "out", "seed"},
         {"quiet"}, {"methods"});
  SweepOptions opt = sweep_options_from_args(a);
  opt.progress = !a.flag("quiet");
  SweepSummary sum;
  Json results = run_sweep(opt, sum);
  RunInfo info = run_info("sweep", args);
  info.argv.insert(info.argv.begin() + 1, "sweep");
  info.config = sweep_config_json(opt);
  info.seeds = {{"base", opt.seed}};
  Json report = make_report(info, results);
  report["summary"] = {{"ok", sum.ok}, {"oom", sum.oom}, {"skipped", sum.skipped}, {"errors", sum.errors}};
  if (auto out = a.get("out")) write_report(*out, report);
  std::cout << fmt::format("sweep {}: {} ok, {} oom, {} skipped, {} errors\n", opt.mode, sum.ok, sum.oom, sum.skipped,
                           sum.errors);
  return sum.errors == 0 ? 0 : 1;
}


// ------------------------------------------------------------------ train / leaderboard
int progress_mode(bool quiet) { return quiet ? 0 : (::isatty(STDOUT_FILENO) ? 2 : 1); }

int cmd_train(const std::vector<std::string>& args) {
  Args a(args, {"method", "preset", "steps", "batch", "micro-batch", "seed", "data", "out", "config", "eval-every",
                "eval-batches", "checkpoint-every", "stop-after", "device", "probes"},
         {"resume", "quiet"});
  TrainOptions o;
  auto m = a.get("method");
  if (!m) throw UsageError("train needs --method NAME");
  o.method = *m;
  o.preset = a.get_or("preset", "tiny");
  o.steps = a.get_int("steps", 0);
  o.batch = a.get_int("batch", 0);
  o.micro_batch = a.get_int("micro-batch", 0);
  if (o.micro_batch < 0) throw UsageError("--micro-batch must be >= 0");
  o.seed = uint64_t(a.get_int("seed", 0));
  o.data = a.get_or("data", "synthetic");
  o.out = a.get_or("out", "");
  o.config = a.get_or("config", "");
  o.resume = a.flag("resume");
  o.eval_every = a.get_int("eval-every", 0);
  o.eval_batches = a.get_int("eval-batches", 0);
  o.checkpoint_every = a.get_int("checkpoint-every", 0);
  o.stop_after = a.get_int("stop-after", 0);
  o.device = a.get_or("device", "cpu");
  o.probe_sequences = a.get_int("probes", -1);
  if (o.probe_sequences < -1) throw UsageError("--probes must be >= 0");
  if (o.steps < 0 || o.batch < 0 || o.eval_every < 0 || o.eval_batches < 0 || o.checkpoint_every < 0 || o.stop_after < 0)
    throw UsageError("--steps, --batch, --eval-every, --eval-batches, --checkpoint-every and --stop-after must be >= 0");
  o.progress = progress_mode(a.flag("quiet"));
  TrainResult r = run_train(o);
  RunInfo info = run_info("train", args);
  info.argv.insert(info.argv.begin() + 1, "train");
  info.config = {{"method", o.method}, {"preset", o.preset}, {"config", r.cfg.to_json()}, {"steps", o.steps},
                 {"batch", o.batch}, {"micro_batch", o.micro_batch}, {"data", o.data}, {"resume", o.resume}};
  info.seeds = {{"base", o.seed}};
  Json report = make_report(info, Json::array({train_result_json(r)}));
  if (!o.out.empty()) write_report((std::filesystem::path(o.out) / "train.json").string(), report);
  std::cerr << fmt::format("train {}: {} steps, val {} {:.4f}, {:.0f} tok/s\n", r.method, r.steps_done,
                           r.byte_level ? "bpb" : "bits/token", r.val_bpb, r.tokens_per_s);
  return 0;
}

int cmd_leaderboard(const std::vector<std::string>& args) {
  Args a(args, {"preset", "steps", "batch", "micro-batch", "seed", "data", "out", "config", "device", "probes"},
         {"quiet"}, {"methods"});
  LeaderboardOptions o;
  o.preset = a.get_or("preset", "tiny");
  o.methods = a.list("methods");
  o.steps = a.get_int("steps", 0);
  o.batch = a.get_int("batch", 0);
  o.micro_batch = a.get_int("micro-batch", 0);
  if (o.micro_batch < 0) throw UsageError("--micro-batch must be >= 0");
  o.seed = uint64_t(a.get_int("seed", 0));
  o.data = a.get_or("data", "synthetic");
  o.config = a.get_or("config", "");
  o.out = a.get_or("out", "");
  o.device = a.get_or("device", "cpu");
  o.probe_sequences = a.get_int("probes", -1);
  if (o.steps < 0 || o.batch < 0 || o.probe_sequences < -1) throw UsageError("--steps, --batch and --probes must be >= 0");
  o.progress = progress_mode(a.flag("quiet"));
  std::string md;
  Json results = run_leaderboard(o, md);
  RunInfo info = run_info("leaderboard", args);
  info.argv.insert(info.argv.begin() + 1, "leaderboard");
  info.config = {{"preset", o.preset}, {"methods", results.size()}, {"steps", o.steps}, {"batch", o.batch},
                 {"data", o.data}, {"config", o.config}, {"anchor", "dense"}, {"device", o.device}};
  info.seeds = {{"base", o.seed}};
  Json report = make_report(info, results);
  report["markdown"] = md;
  if (!o.out.empty()) {
    write_report(o.out, report);
    std::filesystem::path mdp(o.out);
    mdp.replace_extension(".md");
    write_file_atomic(mdp.string(), md);
    std::filesystem::path html(o.out);
    html.replace_extension(".html");
    write_file_atomic(html.string(), leaderboard_html(results, fmt::format("mixbench leaderboard, preset {}", o.preset), md));
  }
  std::cerr << md;
  int rc = 0;
  for (const auto& r : results)
    if (r["status"] != "ok") rc = 1;
  return rc;
}

// ------------------------------------------------------------------ report / validate
Json load_report(const std::string& path) {
  std::string text = read_file(path);
  try {
    return Json::parse(text);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("'{}' is not valid JSON: {}", path, e.what()));
  }
}

int cmd_report(const std::vector<std::string>& args) {
  Args a(args, {});
  if (a.positional().size() != 1) throw UsageError("report takes one FILE");
  Json r = load_report(a.positional()[0]);
  auto errs = validate_json(r, report_schema());
  if (!errs.empty()) throw InputError(fmt::format("'{}' is not a mixbench report: {}", a.positional()[0], errs[0]));
  std::cout << render_markdown(r);
  return 0;
}

int cmd_plot(const std::vector<std::string>& args) {
  Args a(args, {"out"});
  if (a.positional().size() != 1 || !a.get("out")) throw UsageError("plot takes FILE --out page.html");
  Json r = load_report(a.positional()[0]);
  auto errs = validate_json(r, report_schema());
  if (!errs.empty()) throw InputError(fmt::format("'{}' is not a mixbench report: {}", a.positional()[0], errs[0]));
  write_file_atomic(*a.get("out"), render_sweep_html(r));
  std::cout << "wrote " << *a.get("out") << "\n";
  return 0;
}

int cmd_validate(const std::vector<std::string>& args) {
  Args a(args, {});
  if (a.positional().empty()) throw UsageError("validate takes FILE...");
  int rc = 0;
  for (const auto& p : a.positional()) {
    auto errs = validate_json(load_report(p), report_schema());
    if (errs.empty()) std::cout << p << ": valid\n";
    else {
      rc = 1;
      std::cout << p << ": " << errs.size() << " problem(s)\n";
      for (const auto& e : errs) std::cout << "  " << e << "\n";
    }
  }
  return rc;
}

}  // namespace

int run_cli(const std::vector<std::string>& argv) {
  try {
    if (argv.empty() || argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
      std::cout << kUsage;
      return argv.empty() ? 2 : 0;
    }
    const std::string cmd = argv[0];
    std::vector<std::string> rest(argv.begin() + 1, argv.end());
    if (cmd == "list") return cmd_list(rest);
    if (cmd == "conformance") return cmd_conformance(rest);
    if (cmd == "account") return cmd_account(rest);
    if (cmd == "golden") return cmd_golden(rest);
    if (cmd == "sweep") return cmd_sweep(rest);
    if (cmd == "train") return cmd_train(rest);
    if (cmd == "leaderboard") return cmd_leaderboard(rest);
    if (cmd == "plot") return cmd_plot(rest);
    if (cmd == "report") return cmd_report(rest);
    if (cmd == "validate") return cmd_validate(rest);
    auto near = closest_names(cmd, {"list", "conformance", "account", "golden", "sweep", "train", "leaderboard", "plot", "report", "validate"});
    throw UsageError(fmt::format("unknown command '{}'{}", cmd, near.empty() ? "" : " (did you mean " + near[0] + "?)"));
  } catch (const UsageError& e) {
    std::cerr << "mixbench: error: " << e.what() << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "mixbench: error: " << e.what() << "\n";
    return 2;
  } catch (const c10::OutOfMemoryError& e) {
    std::cerr << "mixbench: error: out of memory: " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const c10::Error& e) {
    std::cerr << "mixbench: internal error: " << e.what_without_backtrace() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "mixbench: internal error: " << e.what() << "\n";
    return 3;
  }
}

}  // namespace mixbench
