// The units of a sweep (one method at model or layer level, decode at model level, or one op): at
// each (B, T) the accountant's prediction, built before anything is allocated, and a point to time.
// Used by the sweep driver (sweep.cpp).
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "harness/backbone.h"
#include "harness/registry.h"
#include "suites/sweep.h"

namespace mixbench::sweep_detail {

using Json = nlohmann::json;

// What the sweep needs from a unit at one (B, T): the accountant's numbers (before anything is
// allocated, so that --memory-limit can refuse the point) and a step to time.
struct Prediction {
  double fwd_flops_per_token = NAN;  // accountant; NaN where the unit has none (ops)
  double bytes = NAN;                // predicted memory of the point
  std::string bytes_formula;
  Json shape;
  Json config;
  Json extra_accountant = Json::object();  // mode-specific accountant numbers (decode: FLOPs, cache bytes)
  // Decode: what one step reads besides its cache (the roofline): every parameter except the
  // embedding tables, once, and the B rows it gathers from each table (wte, value embeddings).
  double step_weight_bytes = NAN, step_embedding_row_bytes = NAN;
};

struct Point {
  std::function<void(const std::string& nvtx_prefix)> step;  // one repetition
  std::function<Json()> measured;                             // optional: measurements after timing
  // Optional (methods with their own residual stream and a family control): the same step with
  // the control's stream in place of the method's, on the same sublayers and parameters. The
  // sweep times both and reports the stream's share of the step (`residual_stream`).
  std::function<void(const std::string& nvtx_prefix)> control;
  Json control_info;  // {"stream", "control_stream", "flop_share"}
};

// A unit of the sweep: one method at model or layer level, or one op.
struct Unit {
  std::string method;  // method name (op level: the first selected method that calls the op)
  std::string op;      // op name at op level, else empty
  std::function<Prediction(int64_t B, int64_t T)> predict;
  std::function<void(int64_t T)> setup;                  // builds parameters once; may throw OOM
  std::function<Point(int64_t B, int64_t T)> prepare;  // allocates inputs; may throw OOM
  std::function<void()> release;                         // drop gradients etc. after an OOM
  std::function<void()> finish;  // after the unit's last point: drop its model, caches and graph
};

// Models the sweep's units hold at once (built by setup, dropped by finish, or by release after
// an OOM), and the most they held since the last reset: one when every unit frees its model
// before the next is built.
int64_t models_held();
int64_t models_held_peak();
void reset_models_held_peak();

// Model level: the nanochat backbone with the method in every layer (prefill or train).
Unit model_unit(const MethodSpec& method, const SweepOptions& opt);
// Decode at model level: one decode step of B tokens per repetition after an untimed prefill of T.
Unit decode_unit(const MethodSpec& method, const SweepOptions& opt);
// Layer level: layer 0 of the method's model, on its own (no backbone).
Unit layer_unit(const MethodSpec& method, const SweepOptions& opt);
// Op level: the op on its own with its default parameters (and any --config keys it declares).
Unit op_unit(const std::string& method_name, const OpSpec& op, const SweepOptions& opt);

// The model with its family control's residual stream (MethodSpec::control) in place of its own,
// sharing its sublayers and parameter tensors: for a method with a residual stream of its own whose
// control has one too; nullopt otherwise.
std::optional<Model> control_model(const Model& m);

// The residual stream's share of the model's forward FLOPs per token at length T (its own
// arithmetic plus its matmul parameters' 2·N, over the accountant's forward FLOPs).
double stream_flop_share(const MethodSpec& method, const Config& cfg, int64_t T, int64_t dtype_bytes);

// True when the method and every op it calls have a CUDA path.
bool method_has_cuda(const MethodSpec& m);

}  // namespace mixbench::sweep_detail
