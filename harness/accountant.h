// FLOP and memory accounting types. Each method supplies a per-layer LayerCost next to its code;
// harness/model_account.cpp adds the nanochat backbone and sums over layers.
#pragma once
#include <cstdint>
#include <cmath>
#include <string>

namespace mixbench {

// Parameter counts split as nanochat's num_scaling_params.
struct ParamCount {
  int64_t wte = 0, value_embeds = 0, lm_head = 0, transformer_matrices = 0, scalars = 0;
  int64_t matmul = 0;  // parameters that multiply the token stream (2 FLOPs each per token forward)
  int64_t total() const { return wte + value_embeds + lm_head + transformer_matrices + scalars; }
  ParamCount& operator+=(const ParamCount& o);
};

struct CostQuery {
  int64_t T = 2048;         // sequence length (training / prefill)
  int64_t context = 2048;   // decode context length
  int64_t dtype_bytes = 2;  // element size for activation / cache bytes (bf16)
};

// Per-layer cost of a token mixer, per token unless said otherwise. Every number states its
// convention in `formula` so reports can show it.
struct LayerCost {
  ParamCount params;                  // the mixer's own parameters
  double fwd_flops = 0;               // executed forward FLOPs per token at length T (causal pairs exact)
  double nanochat_core_flops = 0;     // training FLOPs/token of the non-matmul core, nanochat's convention
  // Part of fwd_flops executed as element-wise arithmetic that the dispatcher-level FlopCounter
  // cannot see (e.g. a short causal conv written as shifted products); the audit adds it to the
  // counted number and reports it separately, so it must be documented beside its formula.
  double uncounted_flops = 0;
  double decode_flops = 0;            // forward FLOPs for one token at context c (incl. matmuls)
  double act_bytes = 0;               // activation bytes/token saved for backward
  double cache_bytes_per_token = 0;   // KV-cache growth per token (decode)
  double state_bytes = 0;             // fixed recurrent state per sequence (decode)
  // Bytes of its cache one decode step at context q.context reads per sequence, where the layer
  // reads less than all of it (sparse attention: the selected keys, the index); NaN: all of it,
  // cache_bytes_per_token·c + state_bytes.
  double decode_read_bytes = NAN;
  std::string formula;
};

}  // namespace mixbench
