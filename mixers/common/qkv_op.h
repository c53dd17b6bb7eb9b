// The op spec shared by the attention-shaped ops (attention, sparse_attention,
// block_sparse_attention): inputs q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv] with GQA
// (H a multiple of Hkv), a softmax scale, the case shape H, Hkv, D, Dv, the q/k/v input checks
// and their conformance inputs; output o [B,T,H,Dv]. Each op adds its own params and inputs.
#pragma once
#include <ATen/core/Generator.h>

#include <functional>
#include <string>
#include <vector>

#include "harness/registry.h"

namespace mixbench::qkv_op {

// The op's softmax scale: param "scale", 0 = D^-0.5.
double resolve_scale(const Config& p, int64_t D);

// "scale", then the op's own fields (`own`), then the case shape H, Hkv, D, Dv with the rule
// H % Hkv == 0. The op appends its own rules after.
ConfigSpec params(const std::string& op, const std::function<void(ConfigSpec&)>& own);

// InputError naming the problem: every one of q, k, v and `extra` present, q/k/v 4-D with one
// batch and length, k and v with the same heads, query heads a multiple of them, q and k with
// one head dim. Messages start with "<op>: ".
void check_inputs(const std::string& op, const TensorMap& in, const std::vector<std::string>& extra = {});

// q, k, v of a case: N(0,1) FP64 in the case shape, drawn in that order.
TensorMap make_inputs(const Config& c, int64_t B, int64_t T, at::Generator& gen);

// An OpSpec with name, family, summary, citation, `params`, inputs q, k, v then `extra_inputs`,
// output "o" and `check` as check_inputs; the op fills in the rest.
OpSpec spec(const std::string& name, const std::string& family, const std::string& summary,
            const std::string& citation, const ConfigSpec& params, std::vector<TensorDef> extra_inputs,
            std::function<void(const TensorMap&, const Config&)> check);

}  // namespace mixbench::qkv_op
