// NVTX range names of sweep points, shared by the sweep (which opens them) and the profiler
// (whose ncu filter selects them): "<subject>.sweep.<mode>.B<b>T<t>" with the phases as its
// children "<point>.setup", ".warmup", ".timed", ".forward", ".backward", ".update", ".decode" (and
// ".control.<phase>" for the residual-stream control timed beside a point).
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "harness/nvtx.h"

namespace mixbench {

inline std::string sweep_point_range(const std::string& subject, const std::string& mode, int64_t B, int64_t T) {
  return nvtx_name({subject, "sweep", mode, fmt::format("B{}T{}", B, T)});
}
inline std::string sweep_phase_range(const std::string& point, const std::string& phase) { return point + "." + phase; }

}  // namespace mixbench
