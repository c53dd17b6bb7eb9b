// Atomic file output: write to "<path>.tmp.<pid>", flush, then rename over the target, so a
// reader never sees a partial report.
#pragma once
#include <string>

namespace mixbench {
void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path);  // InputError when unreadable
// Removes a folder of plain files (no subfolders) and the folder; nothing when it does not exist.
// Returns false when something could not be removed. (POSIX calls: std::filesystem::remove_all
// resolves to LibTorch's own copy in a binary linked against it, which crashes.)
bool remove_flat_dir(const std::string& dir);
}  // namespace mixbench
