#include "harness/backbone.h"

namespace mixbench {

bool layer_has_ve(const LayerCtx& ctx) { return ctx.layer % 2 == (ctx.n_layer - 1) % 2; }

}  // namespace mixbench
