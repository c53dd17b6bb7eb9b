#include "harness/config.h"

#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <cmath>
#include <sstream>

#include "harness/errors.h"

namespace mixbench {

std::string FieldDef::type_name() const {
  switch (def.index()) {
    case 0: return "int";
    case 1: return "float";
    case 2: return "bool";
    default: return "string";
  }
}

ConfigSpec& ConfigSpec::i(const std::string& name, int64_t def, const std::string& help,
                          std::optional<double> min, std::optional<double> max) {
  fields_.push_back({name, Value(def), help, min, max, {}});
  return *this;
}
ConfigSpec& ConfigSpec::f(const std::string& name, double def, const std::string& help,
                          std::optional<double> min, std::optional<double> max) {
  fields_.push_back({name, Value(def), help, min, max, {}});
  return *this;
}
ConfigSpec& ConfigSpec::b(const std::string& name, bool def, const std::string& help) {
  fields_.push_back({name, Value(def), help, std::nullopt, std::nullopt, {}});
  return *this;
}
ConfigSpec& ConfigSpec::s(const std::string& name, const std::string& def, const std::string& help,
                          std::vector<std::string> choices) {
  fields_.push_back({name, Value(def), help, std::nullopt, std::nullopt, std::move(choices)});
  return *this;
}
ConfigSpec& ConfigSpec::rule(std::function<void(const Config&)> check) {
  rules_.push_back(std::move(check));
  return *this;
}

const FieldDef* ConfigSpec::find(const std::string& name) const {
  for (const auto& f : fields_)
    if (f.name == name) return &f;
  return nullptr;
}

Config ConfigSpec::defaults() const {
  Config c;
  for (const auto& f : fields_) c.set(f.name, f.def);
  return c;
}

namespace {
Value parse_value(const FieldDef& f, const std::string& text) {
  try {
    size_t used = 0;
    switch (f.def.index()) {
      case 0: {
        // Accept 1k / 2m suffixes for lengths.
        std::string t = text;
        int64_t mult = 1;
        if (!t.empty() && (t.back() == 'k' || t.back() == 'K')) { mult = 1024; t.pop_back(); }
        else if (!t.empty() && (t.back() == 'm' || t.back() == 'M')) { mult = 1024 * 1024; t.pop_back(); }
        int64_t v = std::stoll(t, &used);
        if (used != t.size()) throw std::invalid_argument("trailing");
        return Value(v * mult);
      }
      case 1: {
        double v = std::stod(text, &used);
        if (used != text.size()) throw std::invalid_argument("trailing");
        return Value(v);
      }
      case 2:
        if (text == "1" || text == "true" || text == "on") return Value(true);
        if (text == "0" || text == "false" || text == "off") return Value(false);
        throw std::invalid_argument("bool");
      default:
        return Value(text);
    }
  } catch (const std::exception&) {
    throw InputError(fmt::format("config field '{}' expects {} but got '{}'", f.name, f.type_name(), text));
  }
}
}  // namespace

Config ConfigSpec::parse(const std::string& overrides, const Config* base) const {
  Config c = base ? *base : defaults();
  std::stringstream ss(overrides);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw InputError(fmt::format("config override '{}' is not of the form key=value", item));
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    const FieldDef* f = find(key);
    if (!f) {
      std::string known;
      for (const auto& fd : fields_) known += (known.empty() ? "" : ", ") + fd.name;
      throw InputError(fmt::format("unknown config field '{}' (known: {})", key, known));
    }
    c.set(key, parse_value(*f, val));
  }
  validate(c);
  return c;
}

Config ConfigSpec::from_json(const nlohmann::json& j) const {
  if (!j.is_object()) throw InputError("config must be a JSON object");
  Config c = defaults();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const FieldDef* f = find(it.key());
    if (!f) throw InputError(fmt::format("unknown config field '{}'", it.key()));
    const auto& v = it.value();
    switch (f->def.index()) {
      case 0:
        if (!v.is_number_integer()) throw InputError(fmt::format("config field '{}' expects int", f->name));
        c.set(f->name, Value(v.get<int64_t>()));
        break;
      case 1:
        if (!v.is_number()) throw InputError(fmt::format("config field '{}' expects float", f->name));
        c.set(f->name, Value(v.get<double>()));
        break;
      case 2:
        if (!v.is_boolean()) throw InputError(fmt::format("config field '{}' expects bool", f->name));
        c.set(f->name, Value(v.get<bool>()));
        break;
      default:
        if (!v.is_string()) throw InputError(fmt::format("config field '{}' expects string", f->name));
        c.set(f->name, Value(v.get<std::string>()));
    }
  }
  validate(c);
  return c;
}

void ConfigSpec::validate(const Config& c) const {
  for (const auto& f : fields_) {
    if (!c.has(f.name)) throw InputError(fmt::format("config field '{}' is missing", f.name));
    const Value& v = c.values().at(f.name);
    if (v.index() != f.def.index())
      throw InputError(fmt::format("config field '{}' has the wrong type (expects {})", f.name, f.type_name()));
    if (v.index() <= 1) {
      double x = v.index() == 0 ? double(std::get<int64_t>(v)) : std::get<double>(v);
      if (!std::isfinite(x)) throw InputError(fmt::format("config field '{}' must be finite", f.name));
      if (f.min && x < *f.min)
        throw InputError(fmt::format("config field '{}' = {} is below its minimum {}", f.name, x, *f.min));
      if (f.max && x > *f.max)
        throw InputError(fmt::format("config field '{}' = {} is above its maximum {}", f.name, x, *f.max));
    }
    if (v.index() == 3 && !f.choices.empty()) {
      const auto& s = std::get<std::string>(v);
      if (std::find(f.choices.begin(), f.choices.end(), s) == f.choices.end()) {
        std::string known;
        for (const auto& ch : f.choices) known += (known.empty() ? "" : ", ") + ch;
        throw InputError(fmt::format("config field '{}' = '{}' is not one of: {}", f.name, s, known));
      }
    }
  }
  for (const auto& r : rules_) r(c);
}

const Value& Config::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw InputError(fmt::format("config has no field '{}'", name));
  return it->second;
}
int64_t Config::i(const std::string& name) const {
  const Value& v = get(name);
  if (v.index() != 0) throw InputError(fmt::format("config field '{}' is not an int", name));
  return std::get<int64_t>(v);
}
double Config::f(const std::string& name) const {
  const Value& v = get(name);
  if (v.index() == 0) return double(std::get<int64_t>(v));
  if (v.index() != 1) throw InputError(fmt::format("config field '{}' is not a number", name));
  return std::get<double>(v);
}
bool Config::b(const std::string& name) const {
  const Value& v = get(name);
  if (v.index() != 2) throw InputError(fmt::format("config field '{}' is not a bool", name));
  return std::get<bool>(v);
}
const std::string& Config::s(const std::string& name) const {
  const Value& v = get(name);
  if (v.index() != 3) throw InputError(fmt::format("config field '{}' is not a string", name));
  return std::get<std::string>(v);
}
Config Config::with(const std::string& name, Value v) const {
  Config c = *this;
  c.values_[name] = std::move(v);
  return c;
}

nlohmann::json Config::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : values_) std::visit([&](const auto& x) { j[k] = x; }, v);
  return j;
}

std::string Config::str() const {
  std::string out;
  for (const auto& [k, v] : values_) {
    if (!out.empty()) out += ",";
    out += k + "=";
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, std::string>) out += x;
      else if constexpr (std::is_same_v<T, bool>) out += x ? "true" : "false";
      else out += fmt::format("{}", x);
    }, v);
  }
  return out;
}

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", h);
}

std::string Config::hash() const { return fnv1a_hex(to_json().dump()); }

}  // namespace mixbench
