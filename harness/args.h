// Minimal option parser: "--name value", "--name=value", flags, and multi-value options.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mixbench {

class Args {
 public:
  // `valued`: options that take a value; `multi`: options that take one or more values;
  // `flags`: options without value. Anything else starting with "--" is a UsageError.
  Args(const std::vector<std::string>& args, std::set<std::string> valued, std::set<std::string> flags = {},
       std::set<std::string> multi = {});
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& def) const;
  std::vector<std::string> list(const std::string& name) const;  // multi or comma-separated
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  const std::vector<std::string>& positional() const { return positional_; }
  int64_t get_int(const std::string& name, int64_t def) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

std::vector<std::string> split(const std::string& s, char sep);

}  // namespace mixbench
