#include "harness/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <cstring>
#include <fstream>

#include "harness/errors.h"
#include "harness/io.h"

namespace mixbench {

namespace {
struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int64_t size;
};
const DtypeInfo kDtypes[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4},  {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},    {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};
const DtypeInfo* find_dtype(const std::string& n) {
  for (const auto& d : kDtypes)
    if (n == d.name) return &d;
  return nullptr;
}
const DtypeInfo* find_dtype(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (t == d.type) return &d;
  return nullptr;
}
}  // namespace

SafetensorsFile read_safetensors(const std::string& path, const std::string& role) {
  auto fail = [&](const std::string& why) { return InputError(fmt::format("{} '{}': {}", role, path, why)); };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fail("cannot open");
  in.seekg(0, std::ios::end);
  const int64_t file_size = in.tellg();
  in.seekg(0);
  if (file_size < 8) throw fail(fmt::format("truncated ({} bytes, need at least 8)", file_size));
  uint64_t header_len = 0;
  unsigned char lenbuf[8];
  in.read(reinterpret_cast<char*>(lenbuf), 8);
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | lenbuf[i];
  if (header_len > uint64_t(file_size - 8))
    throw fail(fmt::format("header length {} is larger than the file ({} bytes)", header_len, file_size));
  if (header_len > (100u << 20)) throw fail("header larger than 100 MiB");
  std::string header(header_len, '\0');
  in.read(header.data(), int64_t(header_len));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw fail("header is not a JSON object");
  const int64_t data_size = file_size - 8 - int64_t(header_len);

  SafetensorsFile out;
  struct Item {
    std::string name;
    const DtypeInfo* dt;
    std::vector<int64_t> shape;
    int64_t begin, end;
  };
  std::vector<Item> items;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) throw fail("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) throw fail(fmt::format("metadata '{}' is not a string", m.key()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      throw fail(fmt::format("tensor '{}' lacks dtype, shape or data_offsets", it.key()));
    if (!t["dtype"].is_string()) throw fail(fmt::format("tensor '{}': dtype is not a string", it.key()));
    const DtypeInfo* dt = find_dtype(t["dtype"].get<std::string>());
    if (!dt) throw fail(fmt::format("tensor '{}': unknown dtype '{}'", it.key(), t["dtype"].get<std::string>()));
    if (!t["shape"].is_array()) throw fail(fmt::format("tensor '{}': shape is not an array", it.key()));
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& s : t["shape"]) {
      if (!s.is_number_unsigned() && !(s.is_number_integer() && s.get<int64_t>() >= 0))
        throw fail(fmt::format("tensor '{}': shape entries must be non-negative integers", it.key()));
      int64_t v = s.get<int64_t>();
      if (v > (int64_t(1) << 40)) throw fail(fmt::format("tensor '{}': dimension {} too large", it.key(), v));
      shape.push_back(v);
      numel *= v;
      if (numel > (int64_t(1) << 40)) throw fail(fmt::format("tensor '{}': too many elements", it.key()));
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_integer() || !off[1].is_number_integer())
      throw fail(fmt::format("tensor '{}': data_offsets must be [begin, end]", it.key()));
    int64_t b = off[0].get<int64_t>(), e = off[1].get<int64_t>();
    if (b < 0 || e < b || e > data_size)
      throw fail(fmt::format("tensor '{}': data_offsets [{}, {}] out of range (data is {} bytes)", it.key(), b, e,
                             data_size));
    if (e - b != numel * dt->size)
      throw fail(fmt::format("tensor '{}': {} bytes for shape of {} elements of {}", it.key(), e - b, numel,
                             dt->name));
    items.push_back({it.key(), dt, shape, b, e});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < items.size(); ++i)
    if (items[i].begin < items[i - 1].end)
      throw fail(fmt::format("tensors '{}' and '{}' overlap", items[i - 1].name, items[i].name));

  std::vector<char> data;
  data.resize(static_cast<size_t>(data_size));
  in.read(data.data(), data_size);
  if (in.gcount() != data_size) throw fail("could not read the data section");
  for (const auto& item : items) {
    at::Tensor t = at::empty(item.shape, at::TensorOptions().dtype(item.dt->type));
    if (item.end > item.begin) std::memcpy(t.data_ptr(), data.data() + item.begin, size_t(item.end - item.begin));
    out.tensors.set(item.name, t);
  }
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  int64_t offset = 0;
  std::vector<at::Tensor> blobs;
  for (const auto& [name, t0] : tensors) {
    at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    const DtypeInfo* dt = find_dtype(t.scalar_type());
    if (!dt) throw InputError(fmt::format("cannot store tensor '{}' of dtype {}", name, c10::toString(t.scalar_type())));
    int64_t bytes = t.numel() * dt->size;
    j[name] = {{"dtype", dt->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    blobs.push_back(t);
  }
  std::string header = j.dump();
  while ((header.size() + 8) % 8) header.push_back(' ');
  std::string bytes;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(char((n >> (8 * i)) & 0xff));
  bytes += header;
  for (const auto& t : blobs) bytes.append(static_cast<const char*>(t.data_ptr()), size_t(t.numel() * t.element_size()));
  write_file_atomic(path, bytes);
}

}  // namespace mixbench
