#!/usr/bin/env python3
"""Merge mixbench's Google Benchmark JSON (GPU run) with the peers' timings into one comparison
report with ratios.  Usage:
  ci/compare.py bench_cuda.json peers.json [--gpu-info gpu.txt] [--lifted chunk_fla_bwd.json] --out comparison.json
gpu.txt: nvidia-smi's CSV (name, driver_version, memory.total), as ci/gpu.sh writes it.
chunk_fla_bwd.json: `ci/kernels/chunk_check.py --fla-bwd` from the same call: flash-linear-attention's
forward (peer_status "ok") and forward + backward timed with its Hopper/Triton refusal lifted
(peer_status "ok_refusal_lifted"), rows of their own next to those of peers.py.

ratio_peer_over_ours = peer_ms / ours_ms  (> 1: mixbench is faster).
FLOPs of a linear op call: the accountant's (mixbench_bench's `flops_per_call` counter: the chunked
algorithm's matrix products, and the delta rule's triangular solve, from mixers/linear; fwd+bwd 3×
fwd), the same for ours and the peer (flops_source "accountant"). Benchmarks without that counter
fall back to this model (flops_source "model"), chunk C = 64, per token and head, D = K = V:
  simple_gla fwd = 4·C·D + 4·D²        (QKᵀ and AV inside the chunk; QS and the state update)
  gated_delta_rule fwd = simple_gla fwd + 2·C·D + 2·C·D + 2·D²   (KKᵀ, the WY solve applied to K and V, Sᵀk)
  fwd+bwd = 3 × fwd.  Minimal bytes per token and head: bf16 q, k, v read and o written (4·D·2)
  plus gates (2 bytes each).  Attention: FlashAttention convention on visible pairs.
"""
import argparse
import json
import os
import re

C = 64


def linear_flops(op, D):
    f = 4 * C * D + 4 * D * D
    if op == "gated_delta_rule":
        f += 4 * C * D + 2 * D * D
    return f


def load_json(path, what, key):
    """A JSON report with a top-level `key`, or a clear error naming the file (non-zero exit)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"compare.py: cannot read {what} {path}: {e}")
    if not isinstance(doc, dict) or key not in doc:
        raise SystemExit(f"compare.py: {path} is not {what} (no '{key}')")
    return doc


def gpu_info(path):
    """name, driver and memory from nvidia-smi's CSV (header line, then one line per GPU)."""
    if not path or not os.path.exists(path):
        return {}
    lines = [l.strip() for l in open(path) if l.strip()]
    if len(lines) < 2 or not lines[0].startswith("name"):
        raise SystemExit(f"compare.py: {path} is not nvidia-smi's CSV (name, driver_version, memory.total)")
    name, driver, mem = (x.strip() for x in lines[1].split(",")[:3])
    return {"gpu": name, "driver": driver, "gpu_memory": mem}


def lifted_rows(path):
    """Peer rows from chunk_check.py --fla-bwd: flash-linear-attention forward + backward with its
    refusal lifted, with the relative differences of its gradients from ours."""
    doc = load_json(path, "chunk_check.py output", "timing")
    rows = []
    for t in doc["timing"]:
        for op, key in (("simple_gla", "sgla"), ("gated_delta_rule", "gdn")):
            for phase, name in (("fwd", f"fla_{key}_fwd_ms"), ("fwd_bwd", f"fla_{key}_fwdbwd_ms")):
                if t.get(name) is None:
                    continue
                lifted = phase == "fwd_bwd" and t.get("fla_bwd_refusal_lifted")
                rows.append(dict(peer="flash-linear-attention", peer_version=doc.get("fla"), triton=doc.get("triton"),
                                 op=op, phase=phase, B=t["B"], T=t["T"], H=t["H"], D=t["D"], dtype="bf16",
                                 status="ok_refusal_lifted" if lifted else "ok", median_ms=t[name],
                                 grad_rel_diff_vs_ours=t.get(f"{key}_grad_rel_diff_vs_fla") if phase == "fwd_bwd" else None))
    return rows, doc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("peers")
    ap.add_argument("--gpu-info", help="nvidia-smi CSV (name, driver_version, memory.total)")
    ap.add_argument("--lifted", help="chunk_check.py --fla-bwd output of the same call")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    bench = load_json(a.bench, "Google Benchmark JSON", "benchmarks")
    peers = load_json(a.peers, "peers.py output", "results") if os.path.exists(a.peers) else {"results": []}
    extra, lifted_doc = lifted_rows(a.lifted) if a.lifted else ([], {})
    peer_rows = peers["results"] + extra
    ours, attention, ceilings = {}, [], {}
    for b in bench["benchmarks"]:
        name = b["name"]
        ms = b["real_time"] if b.get("time_unit") == "ms" else b["real_time"] / 1e6
        if b.get("error_occurred"):
            m = re.match(r"linear_cuda/(\w+)/(\w+)/(\d+)", name)
            if m:
                ours[(m.group(1), m.group(2), int(m.group(3)))] = {"error": b.get("error_message", "error")}
            continue
        m = re.match(r"linear_cuda/(\w+)/(\w+)/(\d+)", name)
        if m:
            ours[(m.group(1), m.group(2), int(m.group(3)))] = {"ms": ms, "B": b.get("B"), "label": b.get("label"),
                                                               "flops": b.get("flops_per_call")}
        elif name.startswith("attention_cuda"):
            attention.append({"name": name, "label": b.get("label"), "ms": ms, "TFLOPs": b.get("TFLOPs"),
                              "tokens_per_s": b.get("tokens_per_s")})
        elif name.startswith("ceiling_cuda/matmul"):
            ceilings["matmul_bf16_TFLOPs"] = b.get("TFLOPs")
        elif name.startswith("ceiling_cuda/copy"):
            ceilings["copy_GBps"] = b.get("GBps_rw")
    rows = []
    for p in peer_rows:
        key = (p["op"], p["phase"], p["T"])
        o = ours.get(key, {})
        B, T, H, D = p["B"], p["T"], p["H"], p["D"]
        tokens_heads = B * T * H
        fl = o.get("flops") if o.get("B") == B else None  # the benchmark's accountant count, same shape
        source = "accountant" if fl else "model"
        fl = fl or linear_flops(p["op"], D) * tokens_heads * (3 if p["phase"] == "fwd_bwd" else 1)
        by = tokens_heads * (8 * D + (4 if p["op"] == "gated_delta_rule" else 2))
        row = dict(op=p["op"], phase=p["phase"], B=B, T=T, H=H, D=D, dtype=p["dtype"],
                   peer=p["peer"], peer_version=p.get("peer_version"), peer_triton=p.get("triton"),
                   peer_status=p["status"], peer_ms=p.get("median_ms"), peer_message=p.get("message"),
                   ours_ms=o.get("ms"), ours_error=o.get("error"), flops_per_call=fl, flops_source=source)
        if p.get("grad_rel_diff_vs_ours") is not None:
            row["peer_grad_rel_diff_vs_ours"] = p["grad_rel_diff_vs_ours"]
        if row["ours_ms"]:
            row["ours_TFLOPs"] = fl / row["ours_ms"] / 1e9
            row["ours_GBps"] = by / row["ours_ms"] / 1e6
            if ceilings.get("matmul_bf16_TFLOPs"):
                row["ours_pct_matmul_ceiling"] = 100 * row["ours_TFLOPs"] / ceilings["matmul_bf16_TFLOPs"]
            if ceilings.get("copy_GBps"):
                row["ours_pct_copy_ceiling"] = 100 * row["ours_GBps"] / ceilings["copy_GBps"]
        if row["peer_ms"]:
            row["peer_TFLOPs"] = fl / row["peer_ms"] / 1e9
        if row["ours_ms"] and row["peer_ms"]:
            row["ratio_peer_over_ours"] = row["peer_ms"] / row["ours_ms"]
        rows.append(row)
    # attention: each window against full causal at the same T and phase, same backend family
    full = {}
    for r in attention:
        m = re.search(r"T=(\d+) .*window=(\d+) (\S+)", r["label"] or "")
        if m:
            r.update(T=int(m.group(1)), window=int(m.group(2)), phase=m.group(3))
            if r["window"] == 0:
                full[(r["T"], r["phase"])] = r["ms"]
    for r in attention:
        if "T" in r and r["window"] > 0 and (r["T"], r["phase"]) in full:
            r["speedup_vs_full"] = full[(r["T"], r["phase"])] / r["ms"]
    info = gpu_info(a.gpu_info)
    versions = {"torch": peers.get("torch") or lifted_doc.get("torch")}
    for r in peer_rows:
        versions.setdefault(r["peer"], r.get("peer_version"))
        if r.get("triton"):
            versions.setdefault("triton", r["triton"])
    doc = dict(kind="comparison", gpu=info.get("gpu") or peers.get("gpu") or lifted_doc.get("device"),
               driver=info.get("driver"), gpu_memory=info.get("gpu_memory"), versions=versions,
               torch=versions["torch"], context=bench.get("context"), ceilings=ceilings, linear=rows,
               attention=attention, flop_model=__doc__)
    with open(a.out + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(a.out + ".tmp", a.out)
    for r in rows:
        print(f"{r['op']:18} {r['phase']:8} T={r['T']:6} ours {r['ours_ms']} ms  peer {r['peer_ms']} ms  "
              f"ratio {r.get('ratio_peer_over_ours')}  {r.get('peer_message') or ''}"[:200])


if __name__ == "__main__":
    main()
