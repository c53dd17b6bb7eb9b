// Minimal safetensors reader/writer for golden files and checkpoints. The reader validates everything it reads
// (header size, JSON, dtypes, shapes, offsets in range and not overlapping) and throws InputError
// with the file name and the problem.
#pragma once
#include <ATen/core/Tensor.h>
#include <map>
#include <string>

#include "harness/tensor_map.h"

namespace mixbench {

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  TensorMap tensors;  // in file order of their data offsets
};

// `role` names the file in error messages ("golden file", "checkpoint", ...).
SafetensorsFile read_safetensors(const std::string& path, const std::string& role = "golden file");
// Writes atomically (temp file + rename).
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace mixbench
