// Op `delta_rule`: delta rule: v' = β(v − Sᵀk), S += k v'ᵀ, o = Sᵀ(scale·q).
// Layout and conventions of flash-linear-attention (fla/ops/delta_rule/naive.py): q,k [B,T,H,K],
// v [B,T,H,V], beta [B,T,H], optional h0 and output ht [B,H,K,V].
// The scale (default K^-0.5) multiplies q; q and k are used as given (the layers L2-normalize).
// FP64 reference: reference/delta.cpp. CPU path: the chunked WY/UT form in delta_chunk.cpp.
#include "harness/registry.h"
#include "mixers/linear/delta_chunk.h"

namespace mixbench {
namespace {

OpSpec make_spec() {
  OpSpec s = linear::delta_op_spec(linear::DeltaGate::None);
  s.summary = "delta rule: v' = β(v − Sᵀk), S += k v'ᵀ, o = Sᵀ(scale·q)";
  s.citation = "Schlag et al. 2021; Yang et al. 2024 (parallelizing DeltaNet); fla/ops/delta_rule";
  return s;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
