// mixbench profile: one piece of work under Nsight Compute, per-kernel numbers in JSON (suites/profile.h).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <unistd.h>

#include "harness/cli/commands.h"
#include "harness/errors.h"
#include "suites/profile.h"

namespace mixbench {

namespace {

// This executable's path (ncu runs it again for the work).
std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot find this executable's path (/proc/self/exe)");
  return p.string();
}

int run_profile_command(const Args& a, const std::vector<std::string>& argv) {
  ProfileOptions o;
  o.method = a.get_or("method", "");
  o.op = a.get_or("op", "");
  o.phase = a.get_or("phase", o.phase);
  o.batch = a.get_int("batch", o.batch);
  o.seq_len = a.get_int("seq-len", o.seq_len);
  o.dtype = a.get_or("dtype", o.dtype);
  o.device = a.get_or("device", o.device);
  if (o.device != "cuda") throw UsageError("profile runs on --device cuda (Nsight Compute profiles GPU kernels)");
  o.preset = a.get_or("preset", o.preset);
  o.config = a.get_or("config", "");
  o.launch_count = a.get_int("launch-count", o.launch_count);
  o.ncu = a.get_or("ncu", o.ncu);
  o.timeline = a.flag("timeline");
  o.out = a.get_or("out", "profile.json");
  if (a.flag("print-plan")) {
    ProfilePlan p = profile_plan(o);
    std::cout << "nvtx-include " << p.nvtx_include << "\nwork mixbench";
    for (const auto& s : p.sweep_args) std::cout << " " << s;
    std::cout << "\n";
    return 0;
  }
  std::vector<std::string> command = {"mixbench", "profile"};
  command.insert(command.end(), argv.begin(), argv.end());
  return run_profile(o, self_path(), command);
}

}  // namespace

Command profile_command() {
  return {"profile",
          "one method's or op's phase under Nsight Compute: per-kernel time, FLOPs, bytes, Speed of Light, occupancy",
          "",
          "runs one sweep point of this binary under ncu, selecting the kernels inside the phase's NVTX range "
          "(--nvtx-include \"mixbench@<point>.timed/<point>.<phase>/\", push/pop ranges scoped to the process so the "
          "backward's kernels on autograd's thread count); writes the JSON report, the .ncu-rep beside it, and the "
          "accountant's FLOPs for the same work with the ratio measured ÷ accountant. Exit 2 when ncu is missing",
          {{"method", OptionKind::Value, "NAME", "the registered method (or --op)"},
           {"op", OptionKind::Value, "NAME", "the registered op, run as its first calling method's op-level sweep point"},
           {"phase", OptionKind::Value, "forward|backward|decode|train", "which phase's kernels (default forward)"},
           {"batch", OptionKind::Value, "B", "batch size (default 1)"},
           {"seq-len", OptionKind::Value, "T", "sequence length, or the context for decode (default 4096)"},
           {"dtype", OptionKind::Value, "bf16|fp32", "dtype (default bf16)"},
           {"device", OptionKind::Value, "cuda", "device (cuda only)"},
           {"preset", OptionKind::Value, "gpu-d12|cpu-tiny", "the sweep preset giving the model shape (default gpu-d12)"},
           {"config", OptionKind::Value, "k=v,...", "config overrides for the work"},
           {"launch-count", OptionKind::Value, "N", "profile at most N kernels (default 500)"},
           {"ncu", OptionKind::Value, "PATH", "the ncu executable (default: ncu on PATH, then /usr/local/cuda/bin)"},
           {"timeline", OptionKind::Flag, "", "also record an Nsight Systems trace (needs nsys)"},
           {"print-plan", OptionKind::Flag, "", "print the filter and the work's command line, profile nothing"},
           {"out", OptionKind::Value, "FILE", "the JSON report (default profile.json)"}},
          run_profile_command};
}

}  // namespace mixbench
