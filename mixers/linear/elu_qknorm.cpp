// Method `elu_qknorm` (ELU-Norm; methods.md §2, seed 001): as elu_norm, but before φ = elu + 1 the
// queries and keys get a parameter-free RMSNorm per head computed in FP32 (inputs in a narrower
// dtype are upcast for the norm; FP32/FP64 inputs keep their precision) times the fixed τ = 8.
// Readout: per-head RMSNorm with a learnable gain (kept from elu_norm), then W_o. Op scale 1, no
// decay, no RoPE, no output gate, no short conv.
#include "mixers/linear/gla_family.h"

namespace mixbench::linear {
namespace {
MethodSpec make() {
  GlaFamilyDesc d;
  d.name = "elu_qknorm";
  d.summary = "ELU-Norm: τ·RMSNorm(q,k) (τ=8, FP32) before φ = elu+1, no decay; per-head RMSNorm on the readout";
  d.citation = "benchmark method table (seed 001); Katharopoulos et al. 2020; ReBased (Aksenov et al. 2024)";
  d.op = "simple_gla";
  d.qk_norm = true;
  d.qk_tau = 8.0;
  d.qk_norm_fp32 = true;
  d.feature = "elu1";
  d.scale = 1.0;
  d.decay = "zero";
  d.out_gain = true;
  return make_gla_family_method(d);
}
MIXBENCH_REGISTER(make());
}  // namespace
}  // namespace mixbench::linear
