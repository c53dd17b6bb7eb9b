// The `mixbench` command line: dispatches to the command table (harness/cli/commands.h); every
// command answers --help. run_cli returns the process exit code:
// 0 success / all pass, 1 a check failed, 2 bad usage or input, 3 internal error.
#pragma once
#include <string>
#include <vector>

namespace mixbench {
int run_cli(const std::vector<std::string>& args);
}
