// Nsight Compute profiling of one piece of work: a method or an op, a phase (forward, backward,
// decode step, train step), a shape and a dtype. The work is one sweep point of this binary
// (`mixbench sweep … --reps 1`) run under ncu with an NVTX filter that selects exactly the
// phase's range of that point; ncu's counters per kernel go into a JSON report beside the
// accountant's FLOPs for the same work.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mixbench {

struct ProfileOptions {
  std::string method, op;         // exactly one of them
  std::string phase = "forward";  // forward | backward | decode | train
  int64_t batch = 1, seq_len = 4096;
  std::string dtype = "bf16";
  std::string device = "cuda";
  std::string preset = "gpu-d12";  // the sweep preset whose model shape the work uses
  std::string config;              // extra k=v,... for the sweep
  int64_t launch_count = 500;      // kernels profiled at most
  std::string ncu = "ncu";         // the ncu executable (PATH is searched, then /usr/local/cuda/bin)
  bool timeline = false;           // also record an nsys trace of the same work
  std::string out;                 // report path ("" = profile.json)
};

// The phases and which sweep mode / level runs each.
const std::vector<std::string>& profile_phases();

// What `mixbench profile` runs: the sweep arguments of the work, the NVTX range whose kernels are
// profiled (a direct child of the point's timed range), and ncu's filter for it. UsageError for an
// unknown method, op or phase, a phase the subject lacks (decode without a decode path, decode or
// train for an op), both or neither of method and op.
struct ProfilePlan {
  std::vector<std::string> sweep_args;  // after "mixbench"
  std::string point_range;              // the sweep point's range
  std::vector<std::string> range_path;  // the nested ranges that hold the kernels, outermost first
  std::string nvtx_include;             // ncu's --nvtx-include expression for range_path
  std::string mode, level;              // sweep mode and level
};
ProfilePlan profile_plan(const ProfileOptions& opt);

// Whether a recorded NVTX stack (outermost first) is one ncu's push/pop filter `range_path`
// selects: the path's ranges appear in the stack directly nested, in order.
bool nvtx_stack_matches(const std::vector<std::string>& stack, const std::vector<std::string>& range_path);

// One kernel from ncu's raw CSV page (`ncu --import R --csv --page raw`).
struct KernelProfile {
  std::string name;
  std::string nvtx;                  // ncu's NVTX stack column
  double duration_s = 0;
  double flops = 0;                  // FP32/FP64 FMA·2 + add + mul + tensor-core math ops
  double tensor_flops = 0;           // the tensor-core part
  double dram_bytes = 0;             // read + written
  double sm_pct = 0, dram_pct = 0, memory_pct = 0;  // Speed of Light, % of peak
  double achieved_occupancy_pct = 0;
  int64_t registers_per_thread = 0, shared_mem_static = 0, shared_mem_dynamic = 0;
  int64_t block_size = 0, grid_size = 0;
};
// The metrics ncu is asked for (comma-separated for --metrics).
std::string profile_metrics();
// Parses the raw CSV page (header row, units row, one row per kernel; numbers with thousands
// separators; units such as ns/usecond/msecond, byte/Kbyte/Mbyte/Gbyte and per-block forms such as
// Kbyte/block are converted to seconds and bytes). InputError naming the
// missing column for output that is not such a page.
std::vector<KernelProfile> parse_ncu_raw_csv(const std::string& text);

// Runs the profile: ncu on this binary (`self` = its path), the report at opt.out (atomic), plus the
// ncu report file beside it. Returns the process exit code: 0; 1 when the work or ncu failed or
// no kernel ran in the range (no report), or none was profiled (a report with status fail);
// UsageError (exit 2) for bad input or a missing ncu / nsys.
int run_profile(const ProfileOptions& opt, const std::string& self, const std::vector<std::string>& command);

// The report from parsed kernels (kind "profile"): per kernel its counters, totals, and the
// accountant's FLOPs for the same work with the ratio measured ÷ accountant.
nlohmann::json profile_report(const ProfileOptions& opt, const ProfilePlan& plan,
                              const std::vector<KernelProfile>& kernels, double accountant_flops);

// The accountant's FLOPs of the work (NaN where no accountant exists: op level).
double profile_accountant_flops(const ProfileOptions& opt);

}  // namespace mixbench
