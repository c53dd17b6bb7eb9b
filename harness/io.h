// Atomic file output: write to "<path>.tmp.<pid>", flush, then rename over the target, so a
// reader never sees a partial report.
#pragma once
#include <string>

namespace mixbench {
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path);  // InputError when unreadable
}  // namespace mixbench
