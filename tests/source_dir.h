// The checkout the tests read their data files from (tests/data, tests/goldens, suites, ci).
// Defined in tests/source_dir.cpp, the one test source compiled with the checkout's path, so that the
// other test objects do not depend on where the checkout lies.
#pragma once

namespace mixbench_test {
const char* source_dir();
}  // namespace mixbench_test
