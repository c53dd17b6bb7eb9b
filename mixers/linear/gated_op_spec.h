// Pieces shared by the op specs of `simple_gla` (log decay per head, g [B,T,H]) and `gla` (per key
// channel, g [B,T,H,K]): params (scale; case shape H, K, V; gate_div), case inputs and the cases
// both ops run. Defined in gla_op.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "harness/registry.h"

namespace mixbench::linear {

ConfigSpec gated_op_params();
// q, k, v, g = logsigmoid(randn)/gate_div (per head, or per key channel when per_key), h0; fp64.
TensorMap gated_op_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen, bool per_key);
std::vector<CaseDef> gated_op_cases();

}  // namespace mixbench::linear
