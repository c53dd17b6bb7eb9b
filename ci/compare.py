#!/usr/bin/env python3
"""The comparison report from ci/peers.py's same-process timings (its --timings file), and the short
table printed last.  Usage: ci/compare.py timings.json --out comparison.json

Report (kind "comparison"): gpu, driver, gpu_memory, versions (torch, CUDA runtime, cuDNN, triton,
fla, flash_qla, tilelang, flash_attn; null = not importable, with the error beside it), settings,
ceilings measured in the same process (bf16 matmul TFLOP/s, device-to-device copy GB/s read + write),
and one row per (op, phase, T, output_final_state) with
  flops, bytes            per call, the same for every side (FLOP and byte models below)
  sides{name}             status ok / error / skipped, backend (what ran), eager_ms, graph_ms, the
                          error or graph_error, o_rel_rms_vs_mixbench, and from the graph time (eager
                          where no graph): TFLOPs, GBps, pct_matmul_ceiling, pct_copy_ceiling
  ratio_graph{peer}       peer graph_ms / mixbench graph_ms (> 1: mixbench faster)
  ratio_eager{peer}       the same for eager calls
  fastest_peer            the peer with the smallest graph_ms (eager_ms where none captured)
  headline_ratio          fastest peer's graph_ms / mixbench's graph_ms, headline_eager_ratio beside

FLOPs (the accountant's, mixers/linear/*.h; chunk C = 64, N = ceil(T/C) chunks, per batch row and head):
  simple_gla, gla          N·(2C²K + 2C²V + 4CKV)                      (simple_gla_chunk_flops)
  delta rules, kda         N·(4C²K + 2C²V + 6CKV + C(C−1)(K+V))        (delta_chunk_flops, solve included)
  attention (causal)       4·D·T(T+1)/2                                (FlashAttention's convention)
  fwd_bwd                  3 × fwd for the linear ops, 3.5 × fwd for attention (FlashAttention's)
Bytes: every input read once and every output written once, at its dtype: fwd reads q, k, v (bf16),
g (fp32), beta (bf16) and writes o (bf16) and the final state (fp32, when on); fwd_bwd adds do read
and dq, dk, dv, dg, dbeta written.
"""
import argparse
import json
import os

C = 64
LINEAR = ("simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda")


def write_json(path, doc):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def flops(op, phase, B, T, H, D):
    K = V = D
    if op == "attention":
        fwd = 4.0 * B * H * D * T * (T + 1) / 2
        return fwd * (3.5 if phase == "fwd_bwd" else 1.0)
    N = -(-T // C)
    if op in ("simple_gla", "gla"):
        per_chunk = 2 * C * C * K + 2 * C * C * V + 4 * C * K * V
    elif op in ("delta_rule", "gated_delta_rule", "kda"):
        per_chunk = 4 * C * C * K + 2 * C * C * V + 6 * C * K * V + C * (C - 1) * (K + V)
    else:
        raise ValueError(f"no FLOP model for op '{op}'")
    fwd = float(B * H * N * per_chunk)
    return fwd * (3.0 if phase == "fwd_bwd" else 1.0)


def nbytes(op, phase, B, T, H, D, final_state):
    tok = B * T * H
    q = k = v = o = tok * D * 2
    g = {"simple_gla": tok * 4, "gated_delta_rule": tok * 4, "gla": tok * D * 4, "kda": tok * D * 4}.get(op, 0)
    beta = tok * 2 if op in ("delta_rule", "gated_delta_rule", "kda") else 0
    state = B * H * D * D * 4 if (final_state and op in LINEAR) else 0
    inputs = q + k + v + g + beta
    fwd = inputs + o + state
    if phase == "fwd":
        return fwd
    return fwd + o + inputs  # do read; dq, dk, dv, dg, dbeta written


def build_report(timings):
    if not isinstance(timings, dict) or timings.get("kind") != "peer_timings":
        raise ValueError("not ci/peers.py timings (kind 'peer_timings')")
    env = timings.get("environment", {})
    ceil = timings.get("ceilings", {})
    groups = {}
    for r in timings.get("rows", []):
        key = (r["op"], r["phase"], r["T"], bool(r.get("output_final_state")))
        groups.setdefault(key, []).append(r)
    rows = []
    for (op, phase, T, fs), sides in groups.items():
        s0 = sides[0]
        B, H, D = s0["B"], s0["H"], s0["D"]
        fl, by = flops(op, phase, B, T, H, D), nbytes(op, phase, B, T, H, D, fs)
        row = dict(op=op, phase=phase, T=T, B=B, H=H, D=D, dtype=s0.get("dtype"), output_final_state=fs,
                   flops=fl, bytes=by, sides={}, ratio_graph={}, ratio_eager={})
        for s in sides:
            e = {k: s.get(k) for k in ("status", "backend", "eager_ms", "graph_ms", "error", "graph_error",
                                        "o_rel_rms_vs_mixbench") if s.get(k) is not None}
            ms = s.get("graph_ms") or s.get("eager_ms")
            if ms:
                e["timed"] = "graph" if s.get("graph_ms") else "eager"
                e["TFLOPs"] = fl / ms / 1e9
                e["GBps"] = by / ms / 1e6
                if ceil.get("matmul_bf16_TFLOPs"):
                    e["pct_matmul_ceiling"] = 100 * e["TFLOPs"] / ceil["matmul_bf16_TFLOPs"]
                if ceil.get("copy_GBps"):
                    e["pct_copy_ceiling"] = 100 * e["GBps"] / ceil["copy_GBps"]
            row["sides"][s["side"]] = e
        ours = row["sides"].get("mixbench", {})
        best = None
        for name, e in row["sides"].items():
            if name == "mixbench":
                continue
            if e.get("graph_ms") and ours.get("graph_ms"):
                row["ratio_graph"][name] = e["graph_ms"] / ours["graph_ms"]
            if e.get("eager_ms") and ours.get("eager_ms"):
                row["ratio_eager"][name] = e["eager_ms"] / ours["eager_ms"]
            ms = e.get("graph_ms") or e.get("eager_ms")
            if ms and (best is None or ms < best[1]):
                best = (name, ms)
        if best:
            row["fastest_peer"] = best[0]
            row["headline_ratio"] = row["ratio_graph"].get(best[0])
            row["headline_eager_ratio"] = row["ratio_eager"].get(best[0])
        rows.append(row)
    rows.sort(key=lambda r: (r["op"], r["phase"], r["output_final_state"], r["T"]))
    versions = dict(env.get("versions", {}))
    versions.update(torch=env.get("torch"), cuda_runtime=env.get("cuda_runtime"), cudnn=env.get("cudnn"))
    return dict(kind="comparison", gpu=env.get("gpu"), driver=env.get("driver"), gpu_memory=env.get("gpu_memory"),
                versions=versions, environment=env, settings=timings.get("settings"), ceilings=ceil,
                wall_s=timings.get("wall_s"), rows=rows, method=METHOD, models=__doc__)


METHOD = ("one Python process times every side (ci/peers.py): mixbench through torch.ops.mixbench, each peer "
          "through its Python API, on the same inputs and output options; a first call outside the timing (JIT, "
          "autotuning, plans); eager = median of CUDA-event-bracketed calls synchronised after each; graph = "
          "median of CUDA-event-bracketed replays of a torch.cuda.CUDAGraph holding one call; ratios peer / "
          "mixbench, graph against graph as the headline, eager beside")


def _fmt(x, spec):
    width = int(spec.split(".")[0] or 0)
    return "-".rjust(width) if x is None else format(x, spec)


def table(report):
    """One line per row: mixbench's graph and eager ms, the fastest peer's, the graph ratio."""
    lines = [f"GPU {report.get('gpu')} driver {report.get('driver')}  matmul ceiling "
             f"{_fmt(report['ceilings'].get('matmul_bf16_TFLOPs'), '.0f')} TFLOP/s  copy ceiling "
             f"{_fmt(report['ceilings'].get('copy_GBps'), '.0f')} GB/s",
             f"{'op':17} {'phase':7} {'T':>6} {'fs':2} | {'ours graph':>10} {'eager':>7} | {'fastest peer':32} "
             f"{'graph':>7} {'eager':>7} | {'peer/ours':>9} {'eager':>6} | {'%mm':>4} {'%bw':>4}"]
    for r in report["rows"]:
        ours = r["sides"].get("mixbench", {})
        peer = r.get("fastest_peer")
        p = r["sides"].get(peer, {}) if peer else {}
        peer_name = f"{peer} ({p.get('backend')})" if peer and p.get("backend") and p.get("backend") != peer else peer
        lines.append(f"{r['op']:17} {r['phase']:7} {r['T']:6} {'on' if r['output_final_state'] else 'off':2} | "
                     f"{_fmt(ours.get('graph_ms'), '10.3f')} {_fmt(ours.get('eager_ms'), '7.3f')} | "
                     f"{(peer_name or 'none')[:32]:32} {_fmt(p.get('graph_ms'), '7.3f')} {_fmt(p.get('eager_ms'), '7.3f')} | "
                     f"{_fmt(r.get('headline_ratio'), '9.2f')} {_fmt(r.get('headline_eager_ratio'), '6.2f')} | "
                     f"{_fmt(ours.get('pct_matmul_ceiling'), '4.0f')} {_fmt(ours.get('pct_copy_ceiling'), '4.0f')}")
        if ours.get("status") and ours["status"] != "ok":
            lines.append(f"    mixbench {ours['status']}: {ours.get('error', '')[:150]}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("timings", help="ci/peers.py --timings output")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        with open(a.timings) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"compare.py: cannot read ci/peers.py timings {a.timings}: {e}")
    try:
        report = build_report(doc)
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"compare.py: {a.timings}: {e}")
    write_json(a.out, report)
    print(table(report))


if __name__ == "__main__":
    main()
