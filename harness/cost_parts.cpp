#include "harness/cost_parts.h"

#include <map>
#include <utility>

namespace mixbench {

namespace {
std::map<std::pair<std::string, std::string>, LayerCostPart>& parts() {
  static std::map<std::pair<std::string, std::string>, LayerCostPart> m;
  return m;
}
}  // namespace

bool register_layer_cost_part(const std::string& method, const std::string& part, LayerCostPart fn) {
  parts()[{method, part}] = std::move(fn);
  return true;
}

const LayerCostPart* layer_cost_part(const std::string& method, const std::string& part) {
  auto it = parts().find({method, part});
  return it == parts().end() ? nullptr : &it->second;
}

}  // namespace mixbench
