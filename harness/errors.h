// Error types. Each maps to a process exit code in the CLI:
//   UsageError / InputError -> 2 (bad usage, bad config, corrupt file), everything else -> 3.
#pragma once
#include <stdexcept>
#include <string>

namespace mixbench {

// Wrong command line: unknown command, option, method or op name.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad input data: invalid config values, malformed golden files, wrong shapes.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Allocation failure (real or imposed by a memory limit); sweeps record it as `oom`.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace mixbench
