// The sweep's options (lengths, byte counts, presets, the report's config block) and its driver: every
// unit over batch sizes and lengths, point by point (prediction, memory limit, timing, memory, OOM
// frontier). The units are in sweep_units.cpp, the measurements in sweep_measure.cpp.
#include "suites/sweep.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <new>
#include <optional>
#include <set>

#include "harness/metrics.h"
#include "harness/args.h"
#include "harness/errors.h"
#include "harness/nvtx.h"
#include "suites/mfu.h"
#include "suites/sweep_measure.h"
#include "suites/sweep_units.h"
#include "suites/sweep_ranges.h"

namespace mixbench {

using Json = nlohmann::json;

// ------------------------------------------------------------------ options
namespace {

int64_t parse_count(const std::string& text, const char* what) {
  std::string s = text;
  int64_t mult = 1;
  if (!s.empty()) {
    const char c = char(std::tolower(static_cast<unsigned char>(s.back())));
    if (c == 'k') mult = 1024;
    else if (c == 'm') mult = 1024 * 1024;
    else if (c == 'g') mult = int64_t(1024) * 1024 * 1024;
    if (mult != 1) s.pop_back();
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError(fmt::format("bad {} '{}' (use a positive integer, optionally with k, m or g)", what, text));
  int64_t v = 0;
  try {
    v = std::stoll(s);
  } catch (const std::exception&) {
    throw UsageError(fmt::format("bad {} '{}'", what, text));
  }
  if (v <= 0) throw UsageError(fmt::format("{} must be positive, got '{}'", what, text));
  return v * mult;
}

}  // namespace

std::vector<int64_t> parse_counts(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  for (const auto& item : split(text, ',')) out.push_back(parse_count(item, what));
  if (out.empty()) throw UsageError(fmt::format("empty {} list", what));
  return out;
}

std::vector<int64_t> parse_lengths(const std::string& text) {
  if (auto colon = text.find(':'); colon != std::string::npos) {
    const int64_t a = parse_count(text.substr(0, colon), "length");
    const int64_t b = parse_count(text.substr(colon + 1), "length");
    if (b < a) throw UsageError(fmt::format("length range '{}' ends below its start", text));
    std::vector<int64_t> out;
    for (int64_t t = a; t <= b; t *= 2) out.push_back(t);
    return out;
  }
  std::vector<int64_t> out = parse_counts(text, "length");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

double parse_bytes(const std::string& text) { return double(parse_count(text, "byte count")); }

SweepOptions sweep_preset(const std::string& name) {
  SweepOptions o;
  o.preset = name;
  if (name == "cpu-tiny") {
    o.level = "model";
    o.config = "n_layer=2,d_model=128,head_dim=32,vocab=256";
    o.lengths = parse_lengths("128:2048");
    o.batches = {1, 2};
    o.device = "cpu";
    o.dtype = "fp32";
    o.reps = 3;
    o.warmup = 1;
  } else if (name == "gpu-d12") {
    o.level = "model";
    o.config = "n_layer=12";
    o.lengths = parse_lengths("1k:128k");
    o.batches = {1, 2, 4, 8};
    o.device = "cuda";
    o.dtype = "bf16";
    o.reps = 10;
    o.warmup = 3;
  } else {
    auto near = closest_names(name, {"cpu-tiny", "gpu-d12"});
    throw UsageError(fmt::format("unknown preset '{}'{}", name, near.empty() ? "" : " (did you mean " + near[0] + "?)"));
  }
  return o;
}

Config sweep_method_config(const MethodSpec& m, const SweepOptions& opt, int64_t T) {
  Config c = m.config.parse(opt.config);
  c = c.with("seq_len", T);
  m.config.validate(c);
  return c;
}

Json sweep_config_json(const SweepOptions& o) {
  return {{"mode", o.mode},
          {"methods", o.methods},
          {"level", o.level},
          {"batches", o.batches},
          {"lengths", o.lengths},
          {"device", o.device},
          {"dtype", o.dtype},
          {"preset", o.preset},
          {"config", o.config},
          {"reps", o.reps},
          {"warmup", o.warmup},
          {"graph", o.mode == "decode" ? Json(o.graph) : Json(nullptr)},
          {"memory_limit_bytes", o.memory_limit > 0 ? Json(o.memory_limit) : Json(nullptr)},
          {"optimizer", o.mode == "train"
                            ? Json(fmt::format("plain in-place SGD update (lr {}) standing in for the optimizer step "
                                               "until Muon lands", o.sgd_lr))
                            : Json(nullptr)},
          {"flops_convention",
           o.mode == "train"    ? "accountant forward FLOPs x3 (forward + backward)"
           : o.mode == "decode" ? "accountant decode FLOPs per token at context c, B tokens per step"
           : o.level == "model" ? "accountant forward FLOPs (executed, exact causal pairs), lm_head on the last position only"
                                : "accountant forward FLOPs (executed, exact causal pairs)"}};
}

// ------------------------------------------------------------------ the sweep
std::string sweep_resume_mismatch(const Json& resumed, const Json& config) {
  if (!resumed.is_object() || resumed.value("kind", std::string()) != "sweep" || !resumed.contains("results") ||
      !resumed["results"].is_array())
    return "it is not a sweep report";
  const Json& rc = resumed.value("config", Json::object());
  std::vector<std::string> differ;
  for (auto it = config.begin(); it != config.end(); ++it)
    if (!rc.contains(it.key()) || rc[it.key()] != it.value()) differ.push_back(it.key());
  for (auto it = rc.begin(); it != rc.end(); ++it)
    if (!config.contains(it.key())) differ.push_back(it.key());
  if (differ.empty()) return "";
  std::string list;
  for (const auto& k : differ) list += (list.empty() ? "" : ", ") + k;
  return "its config differs in " + list;
}

Json run_sweep(const SweepOptions& opt, SweepSummary& sum, const SweepProgress& progress) {
  using namespace sweep_detail;
  Registry& reg = Registry::get();
  Json results = Json::array();
  // the earlier run's finished points, by (method, op, B, T)
  auto kept_point = [&](const std::string& method, const std::string& op, int64_t B, int64_t T) -> const Json* {
    for (const auto& x : opt.previous) {
      const std::string st = x.value("status", std::string());
      if ((st != "ok" && st != "oom") || x.value("method", std::string()) != method) continue;
      const Json& xo = x.contains("op") ? x["op"] : Json(nullptr);
      if ((op.empty() ? !xo.is_null() : xo != op) || !x.contains("shape")) continue;
      const Json& sh = x["shape"];
      if (sh.value("B", int64_t(-1)) == B && sh.value("T", int64_t(-1)) == T) return &x;
    }
    return nullptr;
  };
  auto pushed = [&] {
    if (progress) progress(results, sum);
  };
  const bool train = opt.mode == "train";
  auto base = [&](const std::string& method, const std::string& op) {
    return Json{{"method", method}, {"op", op.empty() ? Json(nullptr) : Json(op)}, {"level", opt.level},
                {"mode", opt.mode}, {"device", opt.device}, {"dtype", opt.dtype}};
  };

  std::vector<Unit> units;
  if (opt.level == "op") {
    std::set<std::string> seen;
    for (const auto& name : opt.methods)
      for (const auto& o : reg.method(name).ops)
        if (seen.insert(o).second) units.push_back(op_unit(name, reg.op(o), opt));
  } else {
    for (const auto& name : opt.methods) {
      const MethodSpec& m = reg.method(name);
      if (opt.mode == "decode" && !m.has_decode()) {
        Json r = base(name, "");
        r["status"] = "skipped";
        r["reason"] = "no decode path";
        r["message"] = m.is_hybrid() ? "a layer method of this hybrid registers no decode step"
                                     : "the method registers no decode step with a KV cache or recurrent state";
        r["shape"] = Json::object();
        results.push_back(r);
        ++sum.skipped;
        pushed();
        continue;
      }
      units.push_back(opt.mode == "decode" ? decode_unit(m, opt) : opt.level == "model" ? model_unit(m, opt) : layer_unit(m, opt));
    }
  }

  if (opt.mode == "decode" && !units.empty()) {
    // The roofline's copy bandwidth, measured once before the first point; its buffers go back to
    // the device so that they do not count against the points' memory.
    copy_bandwidth(opt.device);
    free_device_cache(opt.device);
  }
  for (Unit& u : units) {
    if (opt.device == "cuda") {
      const bool has = u.op.empty() ? method_has_cuda(reg.method(u.method)) : bool(reg.op(u.op).cuda);
      if (!has) {
        Json r = base(u.method, u.op);
        r["status"] = "skipped";
        r["reason"] = "no CUDA path";
        r["shape"] = Json::object();
        results.push_back(r);
        ++sum.skipped;
        pushed();
        continue;
      }
    }
    const std::string unit_name = u.op.empty() ? u.method : u.method + "/" + u.op;
    for (int64_t B : opt.batches) {
      std::optional<int64_t> last_fit;
      for (int64_t T : opt.lengths) {
        if (const Json* k = kept_point(u.method, u.op, B, T)) {
          const bool oom = (*k)["status"] == "oom";
          ++(oom ? sum.oom : sum.ok);
          ++sum.kept;
          if (!oom) last_fit = T;
          if (opt.progress)
            std::cerr << fmt::format("sweep {} {} B={} T={}: {}, kept from the report resumed\n", opt.mode, unit_name, B,
                                     T, (*k)["status"].get<std::string>());
          results.push_back(*k);
          pushed();
          if (oom) break;  // the frontier the earlier run found for this batch size
          continue;
        }
        const std::string nv = sweep_point_range(u.op.empty() ? u.method : u.op, opt.mode, B, T);
        Json r = base(u.method, u.op);
        Prediction pred;
        std::string oom_reason, oom_message;
        auto t_start = std::chrono::steady_clock::now();
        try {
          pred = u.predict(B, T);
          r["shape"] = pred.shape;
          r["config"] = pred.config;
          if (opt.memory_limit > 0 && pred.bytes > opt.memory_limit)
            throw OutOfMemory(fmt::format("predicted {} exceeds --memory-limit {}", fmt_bytes(pred.bytes),
                                          fmt_bytes(opt.memory_limit)));
          NvtxRange range(nv);
          MemProbe mem{opt.device};
          Json timing, memory;
          std::function<Json()> measured;
          Json stream_share;
          {
            {
              // The model or layer is built on first use, before the probe, so the delta is the point's.
              NvtxRange setup(sweep_phase_range(nv, "setup"));
              u.setup(T);
            }
            mem.start();
            Point pt = u.prepare(B, T);
            std::vector<double> s = time_reps(pt.step, opt, nv);
            measured = pt.measured;
            sync_device(opt.device);
            memory = mem.finish();
            timing = timing_json(s, opt.warmup);
            if (pt.control) {
              // after the probe, so the point's memory is the method's alone
              std::vector<double> c = time_reps(pt.control, opt, sweep_phase_range(nv, "control"));
              stream_share = stream_share_json(pt.control_info, timing, timing_json(c, opt.warmup));
            }
          }
          const double med = timing["median_s"].get<double>();
          const double tokens = opt.mode == "decode" ? double(B) : double(B * T);  // per repetition
          r["status"] = "ok";
          r["timing"] = timing;
          r["tokens_per_s"] = tokens / med;
          Json acct = {{"predicted_bytes", pred.bytes}, {"predicted_bytes_formula", pred.bytes_formula}};
          if (std::isfinite(pred.fwd_flops_per_token)) {
            const double fpt = pred.fwd_flops_per_token * (train ? 3.0 : 1.0);
            acct["fwd_flops_per_token"] = pred.fwd_flops_per_token;
            acct["flops_per_token"] = fpt;
            acct["flops_per_step"] = fpt * tokens;
            r["flop_per_s"] = fpt * tokens / med;
            // MFU against the matmul rate this device sustains in the sweep's dtype (probed once per run)
            r["mfu"] = mfu(fpt, tokens / med, matmul_peak(opt.device, parse_dtype(opt.dtype)));
          } else {
            acct["fwd_flops_per_token"] = nullptr;
            acct["flops_per_token"] = nullptr;
            acct["flops_per_step"] = nullptr;
            r["flop_per_s"] = nullptr;
            r["mfu"] = nullptr;
          }
          for (auto it = pred.extra_accountant.begin(); it != pred.extra_accountant.end(); ++it) acct[it.key()] = it.value();
          r["accountant"] = acct;
          if (opt.mode == "decode") {
            r["latency_per_token_s"] = med;
            // the share of the device's copy bandwidth the step's reads achieve (probed once per run)
            r["roofline"] = roofline_json(pred.step_weight_bytes, pred.step_embedding_row_bytes,
                                          acct.value("cache_read_bytes", acct["cache_bytes"].get<double>()), med,
                                          copy_bandwidth(opt.device).bytes_per_s);
          }
          if (measured) r["cache"] = measured();
          if (!stream_share.is_null()) r["residual_stream"] = stream_share;
          r["memory"] = memory;
          last_fit = T;
          ++sum.ok;
        } catch (const OutOfMemory& e) {
          oom_reason = "memory limit";
          oom_message = e.what();
        } catch (const c10::OutOfMemoryError& e) {
          oom_reason = "out of memory";
          oom_message = e.what_without_backtrace();
        } catch (const std::bad_alloc& e) {
          oom_reason = "out of memory";
          oom_message = e.what();
        } catch (const InputError& e) {
          r["status"] = "error";
          r["message"] = e.what();
          ++sum.errors;
        } catch (const c10::Error& e) {
          const std::string msg = e.what_without_backtrace();
          if (is_oom_message(msg)) {
            oom_reason = "out of memory";
            oom_message = msg;
          } else {
            r["status"] = "error";
            r["message"] = msg;
            ++sum.errors;
          }
        } catch (const std::exception& e) {
          r["status"] = "error";
          r["message"] = e.what();
          ++sum.errors;
        }
        r["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (!r.contains("shape")) r["shape"] = Json{{"B", B}, {"T", T}};
        if (!oom_reason.empty()) {
          u.release();
          free_device_cache(opt.device);
          r["status"] = "oom";
          r["reason"] = oom_reason;
          r["message"] = oom_message;
          r["last_fit_T"] = last_fit ? Json(*last_fit) : Json(nullptr);
          if (std::isfinite(pred.bytes))
            r["accountant"] = {{"predicted_bytes", pred.bytes}, {"predicted_bytes_formula", pred.bytes_formula}};
          ++sum.oom;
        }
        if (opt.progress) {
          const std::string st = r["status"];
          if (st == "ok")
            std::cerr << fmt::format("sweep {} {} B={} T={}: {:.4g} s median, {:.4g} tokens/s\n", opt.mode, unit_name,
                                     B, T, r["timing"]["median_s"].get<double>(), r["tokens_per_s"].get<double>());
          else
            std::cerr << fmt::format("sweep {} {} B={} T={}: {} ({})\n", opt.mode, unit_name, B, T, st,
                                     r.value("reason", r.value("message", std::string())));
        }
        results.push_back(r);
        pushed();
        if (r["status"] == "oom") break;  // the frontier for this batch size; on to the next one
      }
    }
    // the unit's model, caches and captured step go before the next unit builds its own
    if (u.finish) u.finish();
    free_device_cache(opt.device);
  }
  return results;
}

}  // namespace mixbench
