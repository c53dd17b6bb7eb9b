// Throughput and OOM sweeps: every selected method over a grid of batch sizes and lengths, in one
// mode (prefill, decode or train), at op, layer or model level. Per point: timed repetitions after
// warm-up (median, min, max, IQR), tokens/s, achieved FLOP/s from the accountant, measured peak
// memory beside the accountant's prediction, and `oom` when allocation fails (or the prediction
// exceeds --memory-limit); after an OOM the sweep goes on with the next batch size.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/registry.h"

namespace mixbench {

class Args;

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
};

struct SweepSummary {
  int ok = 0, oom = 0, skipped = 0, errors = 0;
};

// "1k:1m" (doubling, inclusive; k = 1024, m = 1024²) or "256,512,...". UsageError when malformed,
// empty, non-positive or a range whose end is below its start.
std::vector<int64_t> parse_lengths(const std::string& text);
// "123", "2G", "512M", "64k" (powers of 1024). UsageError when malformed.
double parse_bytes(const std::string& text);
// A named preset (cpu-tiny, gpu-d12); UsageError for unknown names.
SweepOptions sweep_preset(const std::string& name);
// The options of `mixbench sweep ...` (preset first, then explicit flags). UsageError on bad input.
SweepOptions sweep_options_from_args(const Args& a);
// The `config` block of the report.
nlohmann::json sweep_config_json(const SweepOptions& opt);

// Runs the sweep; returns the report's `results`. Never throws for OOM: such points are results.
nlohmann::json run_sweep(const SweepOptions& opt, SweepSummary& summary);

}  // namespace mixbench
