// NVTX ranges in the "mixbench" domain, named "<method>/<op>/<phase>". Compiled out unless the
// build defines MIXBENCH_NVTX (CMake option MIXBENCH_NVTX, on by default when NVTX3 is found).
#pragma once
#include <string>

#if defined(MIXBENCH_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace mixbench {

struct NvtxDomainTag {
  static constexpr const char* name = "mixbench";
};

class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
  // Names of ranges opened so far on this thread (kept only while recording is on; for tests).
  static void start_recording();
  static std::vector<std::string> stop_recording();
};

}  // namespace mixbench
