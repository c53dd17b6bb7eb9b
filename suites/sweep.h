// Throughput and OOM sweeps: every selected method over a grid of batch sizes and lengths, in one
// mode (prefill, decode or train), at op, layer or model level. Per point: timed repetitions after
// warm-up (median, min, max, IQR), tokens/s, achieved FLOP/s from the accountant, measured peak
// memory beside the accountant's prediction, and `oom` when allocation fails (or the prediction
// exceeds --memory-limit); after an OOM the sweep goes on with the next batch size.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/registry.h"

namespace mixbench {

struct SweepOptions {
  std::string mode = "prefill";      // prefill | decode | train
  std::vector<std::string> methods;  // registered method names
  std::string level = "model";       // op | layer | model
  std::vector<int64_t> batches = {1, 2};
  std::vector<int64_t> lengths;      // ascending
  std::string device = "cpu";
  std::string dtype = "fp32";
  std::string preset = "cpu-tiny";
  std::string config;                // "k=v,..." overrides applied to every method's config
  int reps = 3, warmup = 1;
  double memory_limit = 0;           // bytes; 0 = none
  uint64_t seed = 0;
  bool progress = true;              // one line per point on stderr
  double sgd_lr = 1e-4;              // train: plain in-place update standing in for the optimizer
  std::string graph = "auto";        // decode on CUDA: auto = the step captured in a CUDA graph where the
                                     // method keeps static caches (eager otherwise), off = eager
  // Resuming: the `results` of an earlier run of the same sweep. A point found there (same method, op,
  // B and T) with status ok or oom is kept as it was and not measured again; error points run again.
  nlohmann::json previous = nlohmann::json::array();
};

struct SweepSummary {
  int ok = 0, oom = 0, skipped = 0, errors = 0;
  int kept = 0;  // of ok and oom: points taken from SweepOptions::previous
};

// Called after every point with the results so far (the CLI writes the report in progress with it).
using SweepProgress = std::function<void(const nlohmann::json& results, const SweepSummary& summary)>;

// "1k:1m" (doubling, inclusive; k = 1024, m = 1024²) or "256,512,...". UsageError when malformed,
// empty, non-positive or a range whose end is below its start.
std::vector<int64_t> parse_lengths(const std::string& text);
// "123", "2G", "512M", "64k" (powers of 1024). UsageError when malformed.
double parse_bytes(const std::string& text);
// "1,2,4" or "2k,4k": positive counts, each optionally with k, m or g (powers of 1024), in the given
// order; `what` names them in the UsageError when one is malformed or non-positive or the list is empty.
std::vector<int64_t> parse_counts(const std::string& text, const char* what);
// A named preset (cpu-tiny, gpu-d12); UsageError for unknown names.
SweepOptions sweep_preset(const std::string& name);
// The method's config for a sweep at length T: opt.config's overrides, then seq_len = T; InputError when
// the method's config does not accept them. (The CLI's options: sweep_options_from_args in
// harness/cli/sweep_args.h.)
Config sweep_method_config(const MethodSpec& m, const SweepOptions& opt, int64_t T);
// The `config` block of the report.
nlohmann::json sweep_config_json(const SweepOptions& opt);

// Runs the sweep; returns the report's `results`. Never throws for OOM: such points are results.
nlohmann::json run_sweep(const SweepOptions& opt, SweepSummary& summary, const SweepProgress& progress = {});

// The earlier report `resumed` may continue the sweep `config` (sweep_config_json) describes: the same
// kind and config block. Returns an empty string when it may, else what differs (for the UsageError).
std::string sweep_resume_mismatch(const nlohmann::json& resumed, const nlohmann::json& config);

}  // namespace mixbench
