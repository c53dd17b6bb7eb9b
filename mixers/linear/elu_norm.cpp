// Method `elu_norm`: linear attention without a denominator (NormAttention idea; methods.md §2,
// seed 001): simple_gla with g = 0 on φ(q), φ(k), φ = elu + 1; readout per-head RMSNorm with a
// learnable gain (size V, shared by heads), then W_o. Choices where the sources are silent:
// op scale 1 (the registered path of seed 001 passes scale=1; the RMSNorm on the readout makes the
// scale irrelevant up to eps), no RoPE, no output gate, no short conv.
#include "mixers/linear/gla_family.h"

namespace mixbench::linear {
namespace {
MethodSpec make() {
  GlaFamilyDesc d;
  d.name = "elu_norm";
  d.summary = "linear attention φ = elu+1, no decay, no denominator; per-head RMSNorm with gain on the output";
  d.citation = "Katharopoulos et al. 2020; Qin et al. 2022 (NormAttention / TransNormer)";
  d.op = "simple_gla";
  d.feature = "elu1";
  d.scale = 1.0;
  d.decay = "zero";
  d.out_gain = true;
  return make_gla_family_method(d);
}
MIXBENCH_REGISTER(make());
}  // namespace
}  // namespace mixbench::linear
