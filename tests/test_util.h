// Small helpers the test files share.
#pragma once
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace mixbench_test {

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

}  // namespace mixbench_test
