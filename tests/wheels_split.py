#!/usr/bin/env python3
"""ci/wheels.py: a wheel over the part size is split into equal parts with its SHA-256, parts and wheels
are grouped into call folders within a budget, and joining them from those folders gives back the
same bytes; a missing part or a corrupted one is a clear error."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, "ci", "wheels.py")
MiB = 1 << 20


def run(*args):
    return subprocess.run([sys.executable, WHEELS, *args], capture_output=True, text=True)


def main():
    d = tempfile.mkdtemp()
    src = os.path.join(d, "stage")
    os.makedirs(src)
    big, small = os.urandom(int(3.5 * MiB)), os.urandom(200_000)
    open(os.path.join(src, "big-1.0-py3-none-any.whl"), "wb").write(big)
    open(os.path.join(src, "small-1.0-py3-none-any.whl"), "wb").write(small)
    r = run("split", src, "--part-mb", "1")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(src))
    assert names == ["big-1.0-py3-none-any.whl.part00", "big-1.0-py3-none-any.whl.part01",
                     "big-1.0-py3-none-any.whl.part02", "big-1.0-py3-none-any.whl.part03",
                     "big-1.0-py3-none-any.whl.sha256", "small-1.0-py3-none-any.whl"], names
    sizes = [os.path.getsize(os.path.join(src, n)) for n in names[:4]]
    assert max(sizes) <= MiB and max(sizes) - min(sizes) <= 3 and sum(sizes) == len(big), sizes
    r = run("batches", src, "--budget-mb", "2")
    assert r.returncode == 0, r.stderr
    calls = sorted(x for x in os.listdir(src) if x.startswith("call"))
    assert calls == ["call1", "call2"], calls  # 4 parts of 0.875 MiB, a 0.19 MiB wheel, the digest: 2 MiB calls
    for c in calls:
        assert sum(os.path.getsize(os.path.join(src, c, f)) for f in os.listdir(os.path.join(src, c))) <= 2 * MiB
    # the other side: each transfer's folder copied under one place, then joined
    there = os.path.join(d, "there")
    for c in calls:
        shutil.copytree(os.path.join(src, c), os.path.join(there, c))
    dest = os.path.join(d, "wheels")
    r = run("join", there, "--to", dest)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(dest)) == ["big-1.0-py3-none-any.whl", "small-1.0-py3-none-any.whl"]
    assert open(os.path.join(dest, "big-1.0-py3-none-any.whl"), "rb").read() == big
    assert open(os.path.join(dest, "small-1.0-py3-none-any.whl"), "rb").read() == small
    # a transfer missing: the missing part is named, exit 2
    part = next(os.path.join(r_, f) for r_, _, fs in os.walk(there) for f in fs if f.endswith(".part02"))
    data = open(part, "rb").read()
    os.remove(part)
    r = run("join", there, "--to", os.path.join(d, "w2"))
    assert r.returncode == 2 and "big-1.0-py3-none-any.whl.part02" in r.stderr, r
    # a corrupted part: the SHA-256 check refuses it and leaves no wheel
    open(part, "wb").write(data[:-1] + bytes([data[-1] ^ 1]))
    r = run("join", there, "--to", os.path.join(d, "w3"))
    assert r.returncode != 0 and "SHA-256" in r.stderr, r
    assert not os.path.exists(os.path.join(d, "w3", "big-1.0-py3-none-any.whl"))
    # a budget smaller than a part: a clear error
    r = run("batches", os.path.join(there, "call1"), "--budget-mb", "0.5")
    assert r.returncode != 0 and "exceeds the per-transfer budget" in r.stderr, r
    print("wheels.py split / batches / join checks passed")


if __name__ == "__main__":
    main()
