// Measurement of one sweep point: repetitions timed after warm-up (CUDA events on the GPU,
// steady_clock on the CPU) and their statistics, peak memory (the CUDA caching allocator on the GPU,
// VmHWM on the CPU), out-of-memory recognition and byte formatting. Used by the sweep driver
// (sweep.cpp); no method or registry knowledge here.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "suites/sweep.h"

namespace mixbench::sweep_detail {

// Times opt.reps repetitions of step after opt.warmup ones, inside NVTX ranges nv + "/warmup" and
// nv + "/timed"; seconds per repetition.
std::vector<double> time_reps(const std::function<void(const std::string&)>& step, const SweepOptions& opt,
                              const std::string& nv);
// The report's `timing` block of the samples s (seconds): reps, warmup, median, min, max, IQR, samples.
nlohmann::json timing_json(std::vector<double> s, int warmup);
// A point's residual-stream share: `info` ({"stream", "control_stream", "flop_share"}) plus the
// control's timing and time_share = 1 − control median ÷ the method's median (the share of the
// step the method's stream costs beyond the control's; noise can make it slightly negative).
nlohmann::json stream_share_json(const nlohmann::json& info, const nlohmann::json& timing,
                                 const nlohmann::json& control_timing);

// Peak memory over a point: start() before allocating its inputs, finish() after timing gives the
// report's `memory` block (source, peak_bytes, delta_bytes, peak_reset).
struct MemProbe {
  std::string device;
  int64_t base = 0;
  bool reset = false;
  void start();
  nlohmann::json finish();
};

// True for the messages allocators give when memory runs out.
bool is_oom_message(const std::string& m);
// Waits for the device ("cuda") to finish; nothing on the CPU.
void sync_device(const std::string& device);
// Returns the CUDA caching allocator's free blocks after an out-of-memory point; nothing on the CPU.
void free_device_cache(const std::string& device);
// "1.50 GiB", "12.0 MiB", "64 KiB".
std::string fmt_bytes(double b);

}  // namespace mixbench::sweep_detail
