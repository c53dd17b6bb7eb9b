// Small helpers the test files share.
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#if defined(MIXBENCH_WITH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace mixbench_test {

// Sets an environment variable for the scope and puts back what it was (or unsets it).
class EnvGuard {
 public:
  EnvGuard(const std::string& name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name.c_str())) old_ = old, had_ = true;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~EnvGuard() {
    if (had_) ::setenv(name_.c_str(), old_.c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A scratch folder of this test process, named after `tag` (created on first use).
inline std::filesystem::path scratch_dir(const std::string& tag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("mixbench_{}_{}", tag, ::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

// How often `part` occurs in `text` (overlapping occurrences counted).
inline size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t p = text.find(part); p != std::string::npos; p = text.find(part, p + 1)) ++n;
  return n;
}

// RMS of got − ref relative to the RMS of ref, both in fp64 on the CPU; where the reference is
// numerically zero (RMS < 1e-12, e.g. a gradient that cancels exactly) the absolute RMS error, as the
// conformance checks do.
inline double rel_rms(const at::Tensor& ref, const at::Tensor& got) {
  const at::Tensor r = ref.detach().to(at::kCPU, at::kDouble), g = got.detach().to(at::kCPU, at::kDouble);
  const double err = (r - g).pow(2).mean().sqrt().item<double>(), norm = r.pow(2).mean().sqrt().item<double>();
  return norm < 1e-12 ? err : err / norm;
}

#if defined(MIXBENCH_WITH_CUDA)
// CUDA's sync debug mode at error for the guard's scope: a host synchronisation (.item(), a copy
// between host and device, nonzero) throws. The previous mode comes back however the scope ends, so a
// failing check cannot leave the mode set for the tests after it.
class SyncDebugErrors {
 public:
  SyncDebugErrors() : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncDebugErrors() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }
  SyncDebugErrors(const SyncDebugErrors&) = delete;
  SyncDebugErrors& operator=(const SyncDebugErrors&) = delete;

 private:
  c10::cuda::SyncDebugMode previous_;
};
#endif

}  // namespace mixbench_test
