"""Run each forward chunk kernel once (and flash-linear-attention's forwards, after their autotuning)
inside a profiler capture range, for Nsight Compute:

  ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
      python3 ci/kernels/chunk_profile.py --lib /tmp/mixbench_chunk.so --T 8192

B·T = 64K, H = 16, K = V = 128, bf16, as the timings of chunk_check.py. The library is built as
chunk_check.py builds it unless PREBUILT is set and it exists.
"""
import argparse
import ctypes
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chunk_check as cc  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="/tmp/libmixbench_chunk.so")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    cc.L = ctypes.CDLL(a.lib) if os.environ.get("PREBUILT") and os.path.exists(a.lib) else cc.build(a.lib)
    cc.POISON = False
    T, H, D = a.T, 16, 128
    B = 65536 // T
    q, k, v, g, beta, _ = cc.inputs(B, T, H, D, D, torch.bfloat16, 16, seed=1)
    qn, kn = F.normalize(q.float(), dim=-1).bfloat16(), F.normalize(k.float(), dim=-1).bfloat16()
    beta = beta.bfloat16()
    sc = D ** -0.5
    peer = None
    if not a.no_peer:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            from fla.ops.simple_gla import chunk_simple_gla
            peer = (chunk_simple_gla, chunk_gated_delta_rule)
            chunk_simple_gla(q, k, v, g)  # autotuning outside the capture range
            chunk_gated_delta_rule(qn, kn, v, g, beta)
        except Exception as e:  # noqa: BLE001
            print("flash-linear-attention not importable:", e)
    cc.sgla_fwd(q, k, v, g, sc, None)
    cc.gdn_fwd(qn, kn, v, g, beta, sc, None, fused=False)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    with torch.cuda.nvtx.range("ours simple_gla: cumsum, walk, output"):
        cc.sgla_fwd(q, k, v, g, sc, None)
    with torch.cuda.nvtx.range("ours gated_delta_rule: cumsum, prep, walk, output"):
        cc.gdn_fwd(qn, kn, v, g, beta, sc, None, fused=False)
    if peer is not None:
        with torch.cuda.nvtx.range("fla simple_gla"):
            peer[0](q, k, v, g)
        with torch.cuda.nvtx.range("fla gated_delta_rule"):
            peer[1](qn, kn, v, g, beta)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
