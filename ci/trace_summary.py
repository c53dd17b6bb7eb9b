#!/usr/bin/env python3
"""Prints the kernel-time summary a `mixbench train --trace` run put in its train.json."""
import json
import sys

for path in sys.argv[1:]:
    r = json.load(open(path))["results"][0]
    t = r.get("trace") or {}
    print(f"{r['method']}: {r['tokens_per_s']:.0f} tok/s, mfu {100 * r['mfu']:.1f}%, traced {t.get('steps')} steps, "
          f"busy {t.get('busy', 0):.3f}, {t.get('kernels_per_step', 0):.0f} kernels/step")
    for k, v in sorted(t.get("by_kind", {}).items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"   {k:18s} {100 * v['share_of_wall']:5.1f}%")
    for o in t.get("top_ops", [])[:16]:
        print(f"   {100 * o['share_of_wall']:5.1f}% {o['kernels']:7d}  {o['op'][:100]}")
