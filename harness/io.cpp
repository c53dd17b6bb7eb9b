#include "harness/io.h"

#include <fmt/format.h>
#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/errors.h"

namespace mixbench {

void write_file_atomic(const std::string& path, const std::string& contents) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (p.has_parent_path() && !p.parent_path().empty()) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw InputError(fmt::format("cannot create folder '{}': {}", p.parent_path().string(), ec.message()));
  }
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(fmt::format("cannot write '{}'", tmp));
    out.write(contents.data(), int64_t(contents.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw InputError(fmt::format("write to '{}' failed (disk full?)", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError(fmt::format("cannot rename '{}' to '{}'", tmp, path));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool remove_flat_dir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return errno == ENOENT;
  bool ok = true;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    ok = unlink((dir + "/" + name).c_str()) == 0 && ok;
  }
  closedir(d);
  return rmdir(dir.c_str()) == 0 && ok;
}

}  // namespace mixbench
