#include "harness/cli/cli.h"

int main(int argc, char** argv) {
  return mixbench::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
