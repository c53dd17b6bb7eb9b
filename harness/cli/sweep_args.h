// `mixbench sweep`'s command-line options into SweepOptions.
#pragma once
#include "suites/sweep.h"

namespace mixbench {

class Args;

// The options of `mixbench sweep ...` (preset first, then explicit flags). UsageError on bad input:
// unknown mode, level, device, dtype, preset or method, malformed numbers, config overrides no selected
// method accepts, --device cuda without a CUDA device.
SweepOptions sweep_options_from_args(const Args& a);

}  // namespace mixbench
