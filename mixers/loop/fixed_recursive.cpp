// fixed_recursive (seed 001, the weight-sharing control): nanochat's SSSL `dense` stack with the
// first block applied once (prelude), the middle n_layer − 2 blocks applied twice in order
// (shared core), the last block once (coda); no gates, no extra inputs. nanochat's stream with one
// resid/x0 scale per unrolled step and its backout at the unrolled midpoint. The split is a config
// choice (n_prelude, n_coda, n_loops); seed 001 names the structure, not the split. By default
// (n_prelude = n_coda = -1) a model of fewer than 3 blocks loops its whole stack.
#include "mixers/loop/loop_common.h"

namespace mixbench {

MIXBENCH_REGISTER(loop_method({"fixed_recursive", "dense",
                               "prelude block once, shared core (n_layer − 2 blocks) twice, coda block once; no gates",
                               "seed 001 (weight-sharing control)", 2, -1, -1, nullptr}));

}  // namespace mixbench
