#!/usr/bin/env python3
"""ci/peers.py end to end on the CPU, small shapes: mixbench's side through torch.ops.mixbench times
eagerly and records why it has no CUDA graph, peers that cannot be imported are recorded with their
error instead of stopping the run, every side of a row computes the same function as ours (SDPA's o
against mixbench's attention), and the report and its table are written. Needs $MIXBENCH_TORCH_OPS_LIB
(or a build*/libmixbench_torch_ops.so)."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    d = tempfile.mkdtemp()
    out, raw = os.path.join(d, "cmp.json"), os.path.join(d, "raw.json")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # a module named fla that fails to import stands in for a broken install
    os.makedirs(os.path.join(d, "site", "fla"))
    open(os.path.join(d, "site", "fla", "__init__.py"), "w").write("raise ImportError('stand-in: broken fla')\n")
    env["PYTHONPATH"] = os.path.join(d, "site") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "peers.py"), "--device", "cpu", "--tokens", "128",
                        "--heads", "2", "--dim", "16", "--lengths", "64,128", "--reps", "2", "--phases", "fwd,fwd_bwd",
                        "--final-state", "off,on", "--out", out, "--timings", raw], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.load(open(out))
    rows = {(x["op"], x["phase"], x["T"], x["output_final_state"]): x for x in doc["rows"]}
    # 2 linear ops x 2 phases x 2 lengths x final state off/on + attention x 2 phases x 2 lengths (no final state)
    assert len(rows) == 2 * 2 * 2 * 2 + 2 * 2, sorted(rows)
    for key, row in rows.items():
        ours = row["sides"]["mixbench"]
        assert ours["status"] == "ok" and ours["eager_ms"] > 0, (key, ours)
        assert "CUDA graphs need a CUDA device" in ours["graph_error"], ours
        assert ours["backend"].startswith("mixbench:"), ours
        if key[0] != "attention":
            for peer in ("fla-triton", "fla-installed"):
                p = row["sides"][peer]
                assert p["status"] == "error" and "broken fla" in p["error"], (key, peer, p)
        if key[0] == "gated_delta_rule":
            assert row["sides"]["flash-qla"]["status"] == "error", row["sides"]["flash-qla"]
        if key[0] == "attention":
            auto = row["sides"]["sdpa-auto"]
            assert auto["status"] == "ok" and auto["o_rel_rms_vs_mixbench"] < 2e-2, auto
            assert row["fastest_peer"] in row["sides"] and row.get("headline_eager_ratio") is not None, row
    assert doc["settings"]["device"] == "cpu" and doc["ceilings"].get("matmul_bf16_TFLOPs", 0) > 0, doc["ceilings"]
    assert json.load(open(raw))["kind"] == "peer_timings"
    table = [l for l in r.stdout.splitlines() if l.split(" ")[0] in ("attention", "simple_gla", "gated_delta_rule")]
    assert len(table) == len(rows), r.stdout[-3000:]  # the table: one line per row
    print("peers.py CPU run checks passed")


if __name__ == "__main__":
    main()
