// The `mixbench` command line. run_cli returns the process exit code:
// 0 success / all pass, 1 a check failed, 2 bad usage or input, 3 internal error.
#pragma once
#include <string>
#include <vector>

namespace mixbench {
int run_cli(const std::vector<std::string>& args);
}
