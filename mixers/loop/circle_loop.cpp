// circle_loop: seed 001 names it among its historical native models (an early native track)
// without a definition, and no public source defines it; it stays out of the registry until one
// does. `mixbench list --all` shows it with this reason.
#include "harness/registry.h"

namespace mixbench {

MIXBENCH_REGISTER_UNLISTED({"circle_loop", "loop",
                            "no public definition (seed 001 names it as a historical native model only)"});

}  // namespace mixbench
