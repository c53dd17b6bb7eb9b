#!/usr/bin/env python3
"""ci/compare.py on small hand-made inputs: ratios, the refusal recorded instead of a time, the
refusal-lifted rows from chunk_check.py --fla-bwd, GPU / driver / versions in the report, and a clear
failure on a file that is not nvidia-smi's CSV."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARE = os.path.join(ROOT, "ci", "compare.py")


def bench(name, ms, **kw):
    return dict(name=name, real_time=ms, time_unit="ms", **kw)


def main():
    d = tempfile.mkdtemp()
    j = lambda n, x: json.dump(x, open(os.path.join(d, n), "w"))
    j("bench.json", {"context": {"date": "x"}, "benchmarks": [
        bench("linear_cuda/simple_gla/fwd/8192/min_time:0.2/manual_time", 1.0, B=8),
        bench("linear_cuda/simple_gla/fwd_bwd/8192/min_time:0.2/manual_time", 4.0, B=8),
        bench("linear_cuda/gated_delta_rule/fwd_bwd/8192/min_time:0.2/manual_time", 5.0, B=8, flops_per_call=3e12),
        bench("ceiling_cuda/matmul_bf16/manual_time", 1.0, TFLOPs=600.0),
        bench("ceiling_cuda/copy/manual_time", 1.0, GBps_rw=4000.0)]})
    common = dict(peer="flash-linear-attention", peer_version="0.6.0", triton="3.6.0", B=8, T=8192, H=16, D=128,
                  dtype="bf16")
    j("peers.json", {"kind": "peers", "torch": "2.11.0", "gpu": "H", "results": [
        dict(common, op="simple_gla", phase="fwd", status="ok", median_ms=1.5),
        dict(common, op="simple_gla", phase="fwd_bwd", status="error", message="RuntimeError: refused")]})
    j("lifted.json", {"device": "H", "torch": "2.11.0", "fla": "0.6.0", "triton": "3.6.0", "timing": [
        dict(B=8, T=8192, H=16, D=128, fla_bwd_refusal_lifted=True, fla_sgla_fwdbwd_ms=6.0, fla_gdn_fwdbwd_ms=4.0,
             fla_sgla_fwd_ms=2.0,
             sgla_grad_rel_diff_vs_fla={"dq": 1e-3}, gdn_grad_rel_diff_vs_fla={"dq": 2e-3})]})
    open(os.path.join(d, "gpu.txt"), "w").write("name, driver_version, memory.total [MiB]\n"
                                                "NVIDIA H200, 580.159.04, 143771 MiB\n")
    out = os.path.join(d, "cmp.json")
    run = lambda *extra: subprocess.run([sys.executable, COMPARE, os.path.join(d, "bench.json"),
                                         os.path.join(d, "peers.json"), "--out", out, *extra],
                                        capture_output=True, text=True)
    r = run("--gpu-info", os.path.join(d, "gpu.txt"), "--lifted", os.path.join(d, "lifted.json"))
    assert r.returncode == 0, r.stderr
    doc = json.load(open(out))
    assert doc["gpu"] == "NVIDIA H200" and doc["driver"] == "580.159.04", doc
    assert doc["versions"] == {"torch": "2.11.0", "flash-linear-attention": "0.6.0", "triton": "3.6.0"}, doc["versions"]
    assert len(doc["linear"]) == 5, doc["linear"]
    rows = {(x["op"], x["phase"], x["peer_status"], x["peer_ms"]): x for x in doc["linear"]}
    rows = {k[:3] if k[3] != 2.0 else k[:3] + ("lifted doc",): x for k, x in rows.items()}
    assert abs(rows[("simple_gla", "fwd", "ok", "lifted doc")]["ratio_peer_over_ours"] - 2.0) < 1e-12
    fwd = rows[("simple_gla", "fwd", "ok")]
    assert abs(fwd["ratio_peer_over_ours"] - 1.5) < 1e-12 and fwd["peer_triton"] == "3.6.0"
    refused = rows[("simple_gla", "fwd_bwd", "error")]
    assert refused["peer_ms"] is None and "ratio_peer_over_ours" not in refused and "refused" in refused["peer_message"]
    lifted = rows[("simple_gla", "fwd_bwd", "ok_refusal_lifted")]
    assert abs(lifted["ratio_peer_over_ours"] - 1.5) < 1e-12 and lifted["peer_grad_rel_diff_vs_ours"] == {"dq": 1e-3}
    gdn = rows[("gated_delta_rule", "fwd_bwd", "ok_refusal_lifted")]
    assert abs(gdn["ratio_peer_over_ours"] - 0.8) < 1e-12
    # the benchmark's accountant FLOPs where it reports them (else the model, and the row says which)
    assert gdn["flops_source"] == "accountant" and abs(gdn["ours_TFLOPs"] - 3e12 / 5.0 / 1e9) < 1e-9, gdn
    assert abs(gdn["peer_TFLOPs"] - 3e12 / 4.0 / 1e9) < 1e-9 and fwd["flops_source"] == "model"
    # TFLOP/s from the FLOP model and % of the measured ceilings
    fl = (4 * 64 * 128 + 4 * 128 * 128) * 8 * 8192 * 16
    assert abs(fwd["ours_TFLOPs"] - fl / 1.0 / 1e9) < 1e-6 and abs(fwd["ours_pct_matmul_ceiling"] - 100 * fl / 1e9 / 600) < 1e-6
    # not nvidia-smi's CSV: a clear error, a non-zero exit, no report written
    os.remove(out)
    open(os.path.join(d, "bad.txt"), "w").write("garbage\n")
    r = run("--gpu-info", os.path.join(d, "bad.txt"))
    assert r.returncode != 0 and "nvidia-smi" in (r.stderr + r.stdout) and not os.path.exists(out), r
    # a truncated benchmark report and a lifted file of the wrong kind: clear errors, no report
    open(os.path.join(d, "trunc.json"), "w").write('{"benchmarks": [')
    r = subprocess.run([sys.executable, COMPARE, os.path.join(d, "trunc.json"), os.path.join(d, "peers.json"),
                        "--out", out], capture_output=True, text=True)
    assert r.returncode != 0 and "cannot read Google Benchmark JSON" in r.stderr and not os.path.exists(out), r
    r = run("--lifted", os.path.join(d, "peers.json"))
    assert r.returncode != 0 and "is not chunk_check.py output" in r.stderr and not os.path.exists(out), r
    print("compare.py report checks passed")


if __name__ == "__main__":
    main()
