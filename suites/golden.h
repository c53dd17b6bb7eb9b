// Golden files: safetensors files holding an op's inputs, its FP64 reference outputs, output
// cotangents `d<output>` and the input gradients `grad_<input>` they give, with the op's name and
// parameters as metadata. write_golden makes one from the reference; read_golden loads and
// validates one (ours or another implementation's) for the conformance suite (run_golden).
#pragma once
#include <cstdint>
#include <string>

#include "harness/config.h"
#include "harness/errors.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "harness/tensor_map.h"

namespace mixbench {

struct GoldenRequest {
  std::string op;      // registered op name (UsageError when unknown)
  std::string config;  // "k=v,..." overrides of the op's parameters
  int64_t batch = 2, seq_len = 33;
  uint64_t seed = 0;   // inputs and cotangents
};

// The file's tensors and metadata: inputs, outputs, cotangents d<o> for floating outputs,
// gradients grad_<i> of the differentiable inputs; metadata op, every parameter, and `scale` where
// the op's default scale (0) stands for 1/√(head dim).
SafetensorsFile make_golden(const GoldenRequest& req);
// make_golden written atomically to `path`; returns the number of tensors written.
size_t write_golden(const GoldenRequest& req, const std::string& path);

struct GoldenFile {
  SafetensorsFile file;        // everything the file holds
  const OpSpec* op = nullptr;  // metadata `op`
  Config config;               // the op's parameters from the metadata
  TensorMap inputs;            // the op's inputs: floating ones as fp64, the others as int64
  TensorMap cotangents;        // output name -> its cotangent d<o> as fp64
  std::string dtype = "fp64";  // "fp32" when the file holds any fp32 tensor
};
// InputError naming the file and the problem when it is malformed, names no or an unknown op,
// has bad parameters, or misses or misshapes a required input.
GoldenFile read_golden(const std::string& path);
// The error for a problem `why` with golden file `path` ("golden file 'PATH': WHY").
InputError golden_file_error(const std::string& path, const std::string& why);

}  // namespace mixbench
