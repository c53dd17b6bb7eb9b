// Layer inputs of a registered method's conformance case, shared by the decode tests.
#pragma once
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>

#include "harness/backbone.h"
#include "harness/registry.h"

namespace mixbench_test {

// The case's layer inputs and random parameters (FP64, from `seed`).
inline mixbench::TensorMap case_inputs(const mixbench::MethodSpec& m, const mixbench::CaseDef& c, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  mixbench::LayerCtx ctx{c.layer, c.cfg.i("n_layer")};
  mixbench::TensorMap in = m.make_inputs(c.cfg, ctx, c.B, c.T, gen);
  for (const auto& def : m.params(c.cfg, ctx))
    in.set(def.name, mixbench::random_param(def, gen, at::TensorOptions().dtype(at::kDouble)));
  return in;
}

// The inputs restricted to positions [a, b): x and, where present, the value embedding ve.
inline mixbench::TensorMap slice_inputs(const mixbench::TensorMap& in, int64_t a, int64_t b) {
  mixbench::TensorMap s = in;
  s.set("x", in.at("x").slice(1, a, b));
  if (in.has("ve")) s.set("ve", in.at("ve").slice(1, a, b));
  return s;
}

}  // namespace mixbench_test
