// Typed configurations: a ConfigSpec declares each field (type, default, bounds, help); a Config
// holds validated values. Methods and ops declare their spec once, next to their code.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace mixbench {

using Value = std::variant<int64_t, double, bool, std::string>;

struct FieldDef {
  std::string name;
  Value def;
  std::string help;
  std::optional<double> min, max;          // numeric bounds (inclusive)
  std::vector<std::string> choices;        // allowed strings (empty = any)
  std::string type_name() const;
};

class Config;

class ConfigSpec {
 public:
  ConfigSpec& i(const std::string& name, int64_t def, const std::string& help,
                std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  ConfigSpec& f(const std::string& name, double def, const std::string& help,
                std::optional<double> min = std::nullopt, std::optional<double> max = std::nullopt);
  ConfigSpec& b(const std::string& name, bool def, const std::string& help);
  ConfigSpec& s(const std::string& name, const std::string& def, const std::string& help,
                std::vector<std::string> choices = {});
  // Cross-field rule, run after the per-field checks; throws InputError with a clear message.
  ConfigSpec& rule(std::function<void(const Config&)> check);

  const std::vector<FieldDef>& fields() const { return fields_; }
  const FieldDef* find(const std::string& name) const;
  Config defaults() const;
  // Override from "k=v,k=v" text (values parsed by the field's type); validates.
  Config parse(const std::string& overrides, const Config* base = nullptr) const;
  Config from_json(const nlohmann::json& j) const;
  void validate(const Config& c) const;  // throws InputError

 private:
  std::vector<FieldDef> fields_;
  std::vector<std::function<void(const Config&)>> rules_;
};

class Config {
 public:
  int64_t i(const std::string& name) const;
  double f(const std::string& name) const;  // accepts int fields too
  bool b(const std::string& name) const;
  const std::string& s(const std::string& name) const;
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  Config with(const std::string& name, Value v) const;
  void set(const std::string& name, Value v) { values_[name] = std::move(v); }
  nlohmann::json to_json() const;
  std::string str() const;   // "k=v,k=v" in field order of the map
  std::string hash() const;  // stable 16-hex-digit FNV-1a of to_json().dump()
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  const Value& get(const std::string& name) const;
  std::map<std::string, Value> values_;
};

// FNV-1a 64-bit, hex string; used for config hashes.
std::string fnv1a_hex(const std::string& text);

}  // namespace mixbench
