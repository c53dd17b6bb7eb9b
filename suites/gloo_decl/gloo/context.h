// Declarations of the Gloo types that torch's ProcessGroupGloo.hpp names. The torch wheel ships
// libtorch_cpu with Gloo built in but not Gloo's headers; mixbench only constructs ProcessGroupGloo and
// calls it through c10d::Backend, so it never uses these types beyond their names (every member of
// ProcessGroupGloo that involves them is a pointer, so the class's size does not depend on them).
// Used only where the real Gloo headers are not found (CMakeLists.txt).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport

namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous

}  // namespace gloo
