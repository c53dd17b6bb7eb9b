// Op `gated_delta_rule`: gated delta rule: S ← exp(g_t)·S, then the delta update.
// Layout and conventions of flash-linear-attention (fla/ops/gated_delta_rule/naive.py): q,k [B,T,H,K],
// v [B,T,H,V], beta [B,T,H], g [B,T,H] (log space), optional h0 and output ht [B,H,K,V].
// The scale (default K^-0.5) multiplies q; q and k are used as given (the layers L2-normalize).
// FP64 reference: reference/delta.cpp. CPU path: the chunked WY/UT form on raw buffers in
// delta_cpu.cpp (backward: gated_delta_backward in delta_chunk.cpp).
#include "harness/registry.h"
#include "mixers/linear/delta_chunk.h"

namespace mixbench {
namespace {

OpSpec make_spec() {
  OpSpec s = linear::delta_op_spec(linear::DeltaGate::Head);
  s.summary = "gated delta rule: S ← exp(g_t)·S, then the delta update";
  s.citation = "Yang, Kautz, Hatamizadeh 2025 (Gated DeltaNet); fla/ops/gated_delta_rule";
  return s;
}

MIXBENCH_REGISTER(make_spec());

}  // namespace
}  // namespace mixbench
