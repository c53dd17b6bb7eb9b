#!/usr/bin/env python3
"""mixbench_bench's CUDA families (attention_cuda, linear_cuda, ceiling_cuda) on whatever machine runs
the tests: every selected benchmark either ran or says "no CUDA device", and the binary exits 0 with a
readable JSON report (before, a machine without a GPU crashed in the first CUDA benchmark).
Usage: bench_cuda_skip.py PATH/TO/mixbench_bench"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    exe = sys.argv[1]
    out = os.path.join(tempfile.mkdtemp(), "bench.json")
    flt = "^(attention_cuda/1024/0/0/1|linear_cuda/simple_gla/fwd/2048|ceiling_cuda/copy_1GiB)"
    r = subprocess.run([exe, f"--benchmark_filter={flt}", "--benchmark_min_time=0.01",
                        f"--benchmark_out={out}", "--benchmark_out_format=json"], capture_output=True, text=True)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    rows = json.load(open(out))["benchmarks"]
    names = sorted(b["name"].split("/min_time")[0].split("/manual_time")[0] for b in rows)
    assert len(rows) == 3, names
    for b in rows:
        if b.get("error_occurred"):
            assert b["error_message"] == "no CUDA device", b
        else:
            assert b["real_time"] > 0, b
    ran = sum(not b.get("error_occurred") for b in rows)
    print(f"CUDA benchmarks: {ran} ran, {len(rows) - ran} skipped (no CUDA device); exit 0")


if __name__ == "__main__":
    main()
