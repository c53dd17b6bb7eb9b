// Layer- and model-level golden files: one registered method's layer (hidden states in, y out) or
// its whole small model (token ids in, logits out) in the op goldens' safetensors conventions
// (suites/golden.h), so that another implementation's layer or model (nanochat's GPT,
// flash-linear-attention's layers) can be checked against mixbench's and mixbench's against it.
//   metadata   method, level ("layer" | "model"), every config field (k = v), layer (layer level:
//              its index in the n_layer model, which decides windows and value embeddings), names
//              (the parameter naming scheme: "mixbench", "nanochat" or "fla"), source, seed
//   inputs     layer: "x" [B,T,d] (+ "ve" [B,T,ve_dim] on a value-embedding layer); model: "idx" [B,T]
//   parameters every parameter under its name in the scheme (harness/foreign_names.h)
//   outputs    layer: "y"; model: "logits" (and "aux_loss" where the layers return one)
//   cotangents "d<output>"
//   gradients  "grad_<name>" of Σ output·cotangent for every parameter and differentiable input
// `mixbench golden --method NAME --level layer|model` writes one from the FP64 reference;
// `mixbench conformance --golden FILE` checks the reference and the optimized path against it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "harness/backbone.h"
#include "harness/registry.h"
#include "harness/safetensors.h"
#include "harness/tensor_map.h"
#include "suites/conformance.h"

namespace mixbench {

struct UnitGoldenRequest {
  std::string method;
  std::string level = "layer";  // "layer" | "model"
  std::string config;           // overrides of the method's config (on its small conformance config)
  std::string names;            // "" (mixbench's), "nanochat" or "fla"
  int64_t batch = 1, seq_len = 17;
  int64_t layer = -1;           // layer level: the layer's index (-1: the first layer without a value embedding)
  uint64_t seed = 0;
};
// The file's tensors and metadata (UsageError for a bad request).
SafetensorsFile make_unit_golden(const UnitGoldenRequest& req);
// make_unit_golden written atomically; returns the number of tensors written.
size_t write_unit_golden(const UnitGoldenRequest& req, const std::string& path);

// A layer or model golden read back: everything converted to mixbench's names and layouts.
struct UnitGolden {
  const MethodSpec* method = nullptr;
  std::string level;
  Config cfg;
  LayerCtx ctx;               // layer level
  std::string names = "mixbench";
  TensorMap inputs;           // x (+ ve) | idx, and every parameter (floating ones as fp64)
  TensorMap expected;         // outputs by name (fp64)
  TensorMap cotangents;       // output name -> cotangent (fp64)
  TensorMap gradients;        // "grad_<our name>" -> expected gradient (fp64)
  std::string dtype = "fp64"; // "fp32" when the file holds any fp32 floating tensor
  std::map<std::string, std::string> metadata;
};
// Whether the file's metadata names a level (a layer or model golden, not an op golden).
bool is_unit_golden(const SafetensorsFile& f);
// InputError ("golden file 'PATH': ...") naming the tensor or field for a malformed file, an
// unknown method or parameter name, a missing parameter or input, or a shape the config contradicts.
UnitGolden read_unit_golden(const std::string& path);
UnitGolden read_unit_golden(const SafetensorsFile& f, const std::string& path);

// The config the metadata gives (its config fields over the method's defaults); InputError on a bad value.
Config config_from_metadata(const MethodSpec& m, const std::map<std::string, std::string>& meta, const std::string& where);
// Every config field as metadata text.
std::map<std::string, std::string> config_metadata(const ConfigSpec& spec, const Config& cfg);

// The conformance rows of one layer or model golden: the FP64 reference and the optimized path at
// opt's dtype and backend, outputs and every gradient against the file.
nlohmann::json run_unit_golden(const std::string& path, const ConformanceOptions& opt);

}  // namespace mixbench
