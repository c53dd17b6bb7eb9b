"""CPU speed of the linear ops' optimized paths against their FP64 recurrent references.

Runs the Google Benchmark binary on the five linear ops (B = 1, H = 4, K = V = 64,
T = 1K..16K, forward, one LibTorch thread), then summarises per op: µs per token at each T (the
fastest repetition over R repetitions in each of N separate runs: other work on the machine only
adds time, and a slow spell can last a whole run), max/min of that over T (target:
≤ 1.25, flat cost per token) and reference ÷ optimized at 4K (target: ≥ 10×). Writes the raw
benchmark JSON and the summary JSON into OUT_DIR and prints a Markdown table.
Usage: python3 ci/bench_cpu_linear.py OUT_DIR [--bench build/mixbench_bench] [--repetitions 5] [--runs 3]
"""
import argparse
import json
import os
import subprocess
import sys

OPS = ("simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bench", default="build/mixbench_bench")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--min-time", default="0.2")
    a = ap.parse_args()
    if not os.path.exists(a.bench):
        sys.exit(f"error: benchmark binary '{a.bench}' not found (build the mixbench_bench target)")
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    per_token = {}  # (op, path) -> {T: µs per token}, the minimum over runs
    cmd = None
    for run in range(a.runs):
        raw = os.path.join(a.out, f"bench_linear_cpu_run{run + 1}.json")
        cmd = [a.bench, f"--benchmark_filter=^({'|'.join(OPS)})/(cpu_fwd|ref_fwd)/",
               "--benchmark_format=console", f"--benchmark_out={raw}.tmp", "--benchmark_out_format=json",
               f"--benchmark_min_time={a.min_time}", f"--benchmark_repetitions={a.repetitions}",
               "--benchmark_report_aggregates_only=true"]
        subprocess.run(cmd, check=True, env=env)
        os.replace(raw + ".tmp", raw)
        for b in json.load(open(raw))["benchmarks"]:
            if b.get("aggregate_name") != "min":
                continue
            op, path, T = b["run_name"].split("/")[:3]
            T = int(T)
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]
            v = b["real_time"] * scale / T
            cur = per_token.setdefault((op, path), {})
            cur[T] = min(cur.get(T, v), v)
    summary = {"machine_load": os.getloadavg(), "repetitions": a.repetitions, "runs": a.runs,
               "statistic": "min over the repetitions of every run",
               "command": " ".join(cmd), "ops": {}}
    print("| op | µs/token at " + " / ".join(f"{T // 1024}K" for T in sorted(per_token.get((OPS[0], 'cpu_fwd'), {}))) +
          " | max/min | ref ÷ opt at 4K |")
    print("|---|---|---:|---:|")
    ok = True
    for op in OPS:
        opt = per_token.get((op, "cpu_fwd"), {})
        ref = per_token.get((op, "ref_fwd"), {})
        if not opt:
            print(f"error: no cpu_fwd results for {op}", file=sys.stderr)
            sys.exit(1)
        flat = max(opt.values()) / min(opt.values())
        speedup = ref[4096] / opt[4096] if 4096 in ref and 4096 in opt else None
        met = flat <= 1.25 and speedup is not None and speedup >= 10
        ok &= met
        summary["ops"][op] = {"us_per_token": {str(T): v for T, v in sorted(opt.items())},
                              "reference_us_per_token": {str(T): v for T, v in sorted(ref.items())},
                              "max_over_min": flat, "speedup_at_4k": speedup,
                              "targets": {"max_over_min_le": 1.25, "speedup_at_4k_ge": 10.0}, "met": met}
        cells = " / ".join(f"{opt[T]:.2f}" for T in sorted(opt))
        print(f"| {op} | {cells} | {flat:.2f} | " + (f"{speedup:.1f}×" if speedup else "-") + " |")
    path = os.path.join(a.out, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(path + ".tmp", path)
    print("targets", "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
