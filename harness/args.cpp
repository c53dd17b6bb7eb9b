#include "harness/args.h"

#include <fmt/format.h>
#include <sstream>

#include "harness/errors.h"
#include "harness/registry.h"

namespace mixbench {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

Args::Args(const std::vector<std::string>& args, std::set<std::string> valued, std::set<std::string> flags,
           std::set<std::string> multi) {
  std::vector<std::string> known;
  for (const auto* set : {&valued, &flags, &multi})
    for (const auto& k : *set) known.push_back("--" + k);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (flags.count(name)) {
      if (has_value) throw UsageError(fmt::format("option --{} takes no value", name));
      flags_.insert(name);
    } else if (valued.count(name)) {
      if (!has_value) {
        if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
          throw UsageError(fmt::format("option --{} needs a value", name));
        value = args[++i];
      }
      values_[name] = {value};
    } else if (multi.count(name)) {
      auto& v = values_[name];
      if (has_value) v.push_back(value);
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) v.push_back(args[++i]);
      if (v.empty()) throw UsageError(fmt::format("option --{} needs at least one value", name));
    } else {
      auto near = closest_names("--" + name, known);
      throw UsageError(fmt::format("unknown option --{}{}", name,
                                   near.empty() ? "" : fmt::format(" (did you mean {}?)", near[0])));
    }
  }
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::string Args::get_or(const std::string& name, const std::string& def) const {
  auto v = get(name);
  return v ? *v : def;
}

std::vector<std::string> Args::list(const std::string& name) const {
  std::vector<std::string> out;
  auto it = values_.find(name);
  if (it == values_.end()) return out;
  for (const auto& v : it->second)
    for (const auto& p : split(v, ',')) out.push_back(p);
  return out;
}

int64_t Args::get_int(const std::string& name, int64_t def) const {
  auto v = get(name);
  if (!v) return def;
  try {
    size_t used = 0;
    std::string t = *v;
    int64_t mult = 1;
    if (!t.empty() && (t.back() == 'k' || t.back() == 'K')) { mult = 1024; t.pop_back(); }
    int64_t x = std::stoll(t, &used);
    if (used != t.size()) throw std::invalid_argument("");
    return x * mult;
  } catch (const std::exception&) {
    throw UsageError(fmt::format("option --{} expects an integer, got '{}'", name, *v));
  }
}

}  // namespace mixbench
