#!/usr/bin/env python3
"""ci/compare.py on hand-made ci/peers.py timings: graph and eager ratios against each peer and the
fastest peer, FLOP and byte models, shares of the measured ceilings, failed and skipped sides kept
with their errors, GPU / driver / versions in the report, the printed table, and clear failures
(non-zero exit, no report) on input that is not peers.py's; ci/peers.py refuses bad arguments."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARE = os.path.join(ROOT, "ci", "compare.py")
PEERS = os.path.join(ROOT, "ci", "peers.py")
sys.path.insert(0, os.path.join(ROOT, "ci"))
import compare  # noqa: E402


def row(side, op="gated_delta_rule", phase="fwd", T=8192, fs=False, **kw):
    return dict(op=op, phase=phase, T=T, B=65536 // T, H=16, D=128, dtype="bf16", output_final_state=fs, side=side, **kw)


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol * max(1.0, abs(b))


def main():
    timings = dict(kind="peer_timings", environment=dict(
        gpu="NVIDIA H200", driver="580.159.04", gpu_memory="143771 MiB", torch="2.11.0", cuda_runtime="13.0",
        cudnn=91000, versions=dict(triton="3.6.0", fla="0.6.0", flash_qla="0.1.3", tilelang="0.1.15", flash_attn=None,
                                   flash_attn_import_error="ModuleNotFoundError: No module named 'flash_attn'")),
        settings=dict(tokens=65536), ceilings=dict(matmul_bf16_TFLOPs=800.0, copy_GBps=4000.0), rows=[
            row("mixbench", status="ok", backend="mixbench:gated_delta_rule_tc", eager_ms=2.0, graph_ms=1.6),
            row("fla-triton", status="ok", backend="triton", eager_ms=2.5, graph_ms=1.7, o_rel_rms_vs_mixbench=2e-3),
            row("fla-installed", status="ok", backend="flash_qla", eager_ms=1.0, graph_ms=0.64),
            row("flash-qla", status="ok", backend="flash_qla (TileLang)", eager_ms=0.9, graph_ms=0.65),
            row("mixbench", phase="fwd_bwd", status="ok", eager_ms=8.0, graph_ms=7.0),
            row("fla-triton", phase="fwd_bwd", status="ok", eager_ms=9.0, graph_error="RuntimeError: capture failed"),
            row("flash-qla", phase="fwd_bwd", status="error", error="ImportError: no tilelang"),
            row("mixbench", op="simple_gla", T=2048, fs=True, status="skipped", error="time budget (--budget-s) spent"),
            row("mixbench", op="attention", T=2048, status="ok", eager_ms=1.0, graph_ms=0.5),
            row("sdpa-flash", op="attention", T=2048, status="ok", eager_ms=1.1, graph_ms=0.6),
        ])
    d = tempfile.mkdtemp()
    src, out = os.path.join(d, "timings.json"), os.path.join(d, "cmp.json")
    json.dump(timings, open(src, "w"))
    r = subprocess.run([sys.executable, COMPARE, src, "--out", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.load(open(out))
    assert doc["kind"] == "comparison" and doc["gpu"] == "NVIDIA H200" and doc["driver"] == "580.159.04", doc
    v = doc["versions"]
    assert v["fla"] == "0.6.0" and v["flash_qla"] == "0.1.3" and v["torch"] == "2.11.0" and v["flash_attn"] is None, v
    rows = {(x["op"], x["phase"], x["T"], x["output_final_state"]): x for x in doc["rows"]}
    assert len(rows) == 4, list(rows)

    fwd = rows[("gated_delta_rule", "fwd", 8192, False)]
    assert fwd["fastest_peer"] == "fla-installed", fwd
    assert close(fwd["headline_ratio"], 0.64 / 1.6) and close(fwd["headline_eager_ratio"], 1.0 / 2.0)
    assert close(fwd["ratio_graph"]["fla-triton"], 1.7 / 1.6) and close(fwd["ratio_eager"]["flash-qla"], 0.9 / 2.0)
    assert fwd["sides"]["fla-installed"]["backend"] == "flash_qla"
    assert fwd["sides"]["fla-triton"]["o_rel_rms_vs_mixbench"] == 2e-3
    # FLOPs: the accountant's delta-rule chunk count; bytes: inputs read once, outputs written once
    B, H, N, K = 8, 16, 8192 // 64, 128
    per_chunk = 4 * 64 * 64 * K + 2 * 64 * 64 * K + 6 * 64 * K * K + 64 * 63 * 2 * K
    assert close(fwd["flops"], B * H * N * per_chunk), fwd["flops"]
    tok = 65536 * 16
    assert fwd["bytes"] == tok * 128 * 2 * 4 + tok * 4 + tok * 2, fwd["bytes"]
    ours = fwd["sides"]["mixbench"]
    assert ours["timed"] == "graph" and close(ours["TFLOPs"], fwd["flops"] / 1.6 / 1e9)
    assert close(ours["pct_matmul_ceiling"], 100 * ours["TFLOPs"] / 800.0)
    assert close(ours["pct_copy_ceiling"], 100 * fwd["bytes"] / 1.6 / 1e6 / 4000.0)

    bwd = rows[("gated_delta_rule", "fwd_bwd", 8192, False)]
    assert close(bwd["flops"], 3 * fwd["flops"])
    assert bwd["bytes"] == fwd["bytes"] + tok * 128 * 2 * 4 + tok * 4 + tok * 2, bwd["bytes"]
    # a side that could not be captured keeps its eager time and the capture error; it is ranked by eager
    tri = bwd["sides"]["fla-triton"]
    assert "graph_ms" not in tri and "capture failed" in tri["graph_error"] and tri["timed"] == "eager", tri
    assert "fla-triton" not in bwd["ratio_graph"] and close(bwd["ratio_eager"]["fla-triton"], 9.0 / 8.0)
    assert bwd["fastest_peer"] == "fla-triton" and bwd["headline_ratio"] is None
    assert bwd["sides"]["flash-qla"] == {"status": "error", "error": "ImportError: no tilelang"}

    skipped = rows[("simple_gla", "fwd", 2048, True)]
    assert skipped["sides"]["mixbench"]["status"] == "skipped" and "fastest_peer" not in skipped
    attn = rows[("attention", "fwd", 2048, False)]
    assert close(attn["flops"], 4.0 * 32 * 16 * 128 * 2048 * 2049 / 2) and close(attn["headline_ratio"], 1.2)
    # the table: one line per row after the header, the fastest peer with its backend
    assert "fla-installed (flash_qla)" in r.stdout and "NVIDIA H200" in r.stdout, r.stdout
    assert len(r.stdout.strip().splitlines()) == 2 + 4 + 1, r.stdout  # header, rows, mixbench's skip note

    # not peers.py's timings: a clear error, a non-zero exit, no report written
    os.remove(out)
    json.dump({"benchmarks": []}, open(src, "w"))
    r = subprocess.run([sys.executable, COMPARE, src, "--out", out], capture_output=True, text=True)
    assert r.returncode != 0 and "not ci/peers.py timings" in r.stderr and not os.path.exists(out), r
    open(src, "w").write('{"kind": "peer_timings", "rows": [')
    r = subprocess.run([sys.executable, COMPARE, src, "--out", out], capture_output=True, text=True)
    assert r.returncode != 0 and "cannot read ci/peers.py timings" in r.stderr and not os.path.exists(out), r
    # peers.py: bad arguments are usage errors (exit 2) before anything is imported or timed
    for args, msg in ((["--ops", "mamba"], "unknown op"), (["--lengths", "1000"], "must divide"),
                      (["--final-state", "maybe"], "--final-state")):
        r = subprocess.run([sys.executable, PEERS, "--out", out, *args], capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
    assert compare.flops("simple_gla", "fwd", 1, 64, 1, 128) == 2 * 64 * 64 * 128 * 2 + 4 * 64 * 128 * 128
    print("compare.py report checks passed")


if __name__ == "__main__":
    main()
