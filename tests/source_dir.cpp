#include "tests/source_dir.h"

namespace mixbench_test {
const char* source_dir() { return MIXBENCH_SOURCE_DIR; }
}  // namespace mixbench_test
