// NVTX ranges in the "mixbench" domain, named "<method>.<op>.<phase>" (nvtx_name). Compiled out
// unless the build defines MIXBENCH_NVTX (CMake option MIXBENCH_NVTX, on by default when NVTX3 is
// found). Names never contain '/': Nsight's NVTX filters (ncu --nvtx-include, nsys) read '/' as the
// separator of nested push/pop ranges, so "mixbench@dense.attention.forward/" selects the kernels
// inside that range wherever it is nested.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#if defined(MIXBENCH_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace mixbench {

// Parts joined by '.'; inside a part every character a filter reads as syntax ('/', '.', '@', '[',
// ']', '*', ',', whitespace) becomes '_'.
std::string nvtx_name(std::initializer_list<std::string> parts);

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
  // With recording on, the stack of open ranges (outermost first) at each range's opening.
  static std::vector<std::vector<std::string>> recorded_stacks();

 private:
  bool recorded_ = false;
};

}  // namespace mixbench
