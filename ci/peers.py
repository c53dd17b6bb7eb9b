#!/usr/bin/env python3
"""Time the peers on the GPU on the shapes of bench/bench_linear_cuda.cpp: flash-linear-attention's
chunk_simple_gla and chunk_gated_delta_rule (Triton), forward and forward+backward, B·T = 64K
tokens per call, H = 16, K = V = 128, bf16, CUDA events after warm-up, median of repetitions,
inputs rotated between two sets. Where a peer refuses or fails, the error is recorded instead
of a time.  Usage: ci/peers.py --out peers.json
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def make(op, B, T, H, D, grad):
    dev, bf = "cuda", torch.bfloat16
    q, k, v = (torch.randn(B, T, H, D, device=dev, dtype=bf) for _ in range(3))
    g = (F.logsigmoid(torch.randn(B, T, H, device=dev)) / 16).to(bf)
    args = dict(q=q, k=k, v=v, g=g)
    if op == "gated_delta_rule":
        args["q"] = F.normalize(q.float(), dim=-1).to(bf)
        args["k"] = F.normalize(k.float(), dim=-1).to(bf)
        args["beta"] = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(bf)
    for t in args.values():
        t.requires_grad_(grad)
    return args


def run_fla(op, args, backward):
    if op == "simple_gla":
        from fla.ops.simple_gla import chunk_simple_gla
        o, _ = chunk_simple_gla(args["q"], args["k"], args["v"], args["g"])
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        o, _ = chunk_gated_delta_rule(args["q"], args["k"], args["v"], args["g"], args["beta"])
    if backward:
        o.backward(torch.ones_like(o))


def time_it(fn, sets, reps=20, warmup=3):
    for i in range(warmup):
        fn(sets[i % 2])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(sets[i % 2])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    results = []
    import fla  # noqa: F401
    version = getattr(fla, "__version__", "?")
    import triton
    for op in ("simple_gla", "gated_delta_rule"):
        for backward in (False, True):
            for T in (2048, 8192, 32768):
                B, H, D = max(1, 65536 // T), 16, 128
                r = dict(peer="flash-linear-attention", peer_version=version, triton=triton.__version__, op=op,
                         phase="fwd_bwd" if backward else "fwd", B=B, T=T, H=H, D=D, dtype="bf16")
                try:
                    sets = [make(op, B, T, H, D, backward) for _ in range(2)]
                    med, lo, hi = time_it(lambda s: run_fla(op, s, backward), sets)
                    r.update(status="ok", median_ms=med, min_ms=lo, max_ms=hi)
                except Exception as e:  # a refusal is a result
                    r.update(status="error", message=f"{type(e).__name__}: {e}"[:500])
                print(json.dumps(r), flush=True)
                results.append(r)
                torch.cuda.empty_cache()
    doc = dict(kind="peers", torch=torch.__version__, gpu=torch.cuda.get_device_name(0), results=results)
    with open(a.out + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    import os
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
