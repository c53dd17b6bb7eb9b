// Model-level golden files: one registered method (a hybrid too) as a whole small FP64 model —
// embedding, every layer, the residual stream, the head — frozen into a safetensors file with its
// inputs and expected outputs, so that any change to the backbone or a method that alters a number
// is caught. Each file holds:
//   metadata  method, config ("k=v,..."), lengths ("1,17,64"), seed, format
//   params    "param.<name>"        every parameter, float32 values (computed with in float64)
//   per T     "idx.T<T>"            token ids [1,T] (int64)
//             "dlogits.T<T>"        the cotangent of the logits (float32 values)
//             "logits.T<T>"         optimized CPU path's logits (float64)
//             "ref_logits.T<T>"     FP64 reference path's logits (float64)
//             "aux_loss.T<T>"       the layers' auxiliary loss, when a layer returns one
//             "grad.T<T>.<name>"    gradient of  Σ logits·dlogits + aux_loss  for every parameter,
//                                   optimized CPU path (float64)
// The accountant's numbers (account_model at the golden config and at the method's defaults) live
// beside them in one JSON file, so a change to a formula is caught too.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/config.h"
#include "harness/registry.h"

namespace mixbench {

// The sequence lengths every model golden holds.
const std::vector<int64_t>& model_golden_lengths();

// The small config a method's golden runs at: its first conformance case's config, shrunk
// (2 layers for a single mixer, d_model 32, head_dim 16, vocab 32, mlp_hidden 32) as far as the
// method's rules accept.
Config model_golden_config(const MethodSpec& m);

// Writes `dir`/<method>.safetensors (atomically).
void write_model_golden(const MethodSpec& m, const std::string& dir);

// One compared tensor: relative error RMS(expected − got) / RMS(expected) — for a gradient over
// the larger of its RMS and the RMS of all the model's gradients at that length, so that gradients
// that are FP64 rounding noise do not depend on the CPU's BLAS — and whether it is within `tol`
// (exact agreement is expected: the default tolerance is 1e-12).
struct GoldenDiff {
  std::string tensor;
  double rel = 0;
  bool pass = false;
};
// Recomputes everything from the file's parameters and inputs with the current code and compares.
// InputError for a file that is missing, malformed or names an unknown method; a parameter the
// current model lacks (or a model parameter the file lacks) is a failing entry, not an exception.
std::vector<GoldenDiff> check_model_golden(const std::string& path, double tol = 1e-12);

// The accountant's numbers for every registered method (golden config at T = 64 and the method's
// default config at its seq_len, context = seq_len).
nlohmann::json account_golden();
// Compares a stored account_golden() JSON with the current one: one entry per number.
std::vector<GoldenDiff> check_account_golden(const nlohmann::json& stored, double tol = 1e-12);

}  // namespace mixbench
