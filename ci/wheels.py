#!/usr/bin/env python3
"""Wheels too large to copy to the GPU machine in one transfer beside the working tree: split them into
parts, group parts and wheels into one folder per transfer, and join them again on the other side.

  ci/wheels.py split DIR [--part-mb 30] [--fit]
                                         every DIR/*.whl over the part size becomes DIR/<wheel>.partNN
                                         files and DIR/<wheel>.sha256 (the original is removed); --fit:
                                         parts no larger than what a transfer has left (see batches)
  ci/wheels.py batches DIR [--budget-mb N | --reserve-mb R] moves DIR's wheels and parts into DIR/call1, DIR/call2, ...
                                         each at most the budget: by default what a transfer has left of its
                                         64 MiB beside this repository's working tree (tracked and
                                         untracked-not-ignored files, measured here); prints the plan
  ci/wheels.py join SRC... --to DEST     copies whole wheels from the SRC folders (searched recursively)
                                         to DEST and joins each split wheel's parts there, checking the
                                         SHA-256; a missing part is an error naming it (exit 2)
"""
import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys

MiB = 1 << 20
CALL_LIMIT = 64 * MiB
PART = re.compile(r"^(?P<wheel>.+\.whl)\.part(?P<n>\d+)$")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def split(d, part_bytes):
    for whl in sorted(glob.glob(os.path.join(d, "*.whl"))):
        size = os.path.getsize(whl)
        if size <= part_bytes:
            continue
        n = -(-size // part_bytes)
        each = -(-size // n)  # equal parts, each under the limit
        with open(whl, "rb") as f:
            for i in range(n):
                with open(f"{whl}.part{i:02d}", "wb") as out:
                    out.write(f.read(each))
        with open(f"{whl}.sha256", "w") as out:
            out.write(f"{sha256(whl)} {n}\n")
        os.remove(whl)
        print(f"split {os.path.basename(whl)} ({size / MiB:.1f} MiB) into {n} parts")


def tree_bytes(repo):
    """Bytes of what a transfer copies from the repository: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    total = 0
    for name in out.split(b"\0"):
        p = os.path.join(repo, name.decode())
        if name and os.path.isfile(p) and not os.path.islink(p):
            total += os.path.getsize(p)
    return total


def measured_budget(reserve=0):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tree = tree_bytes(repo)
    budget = CALL_LIMIT - tree - reserve - MiB
    print(f"working tree {tree / MiB:.1f} MiB, {reserve / MiB:.1f} MiB reserved: {budget / MiB:.1f} MiB left a transfer "
          "(1 MiB kept spare)")
    if budget <= 0:
        raise SystemExit("wheels.py: no room for wheels beside the working tree in a 64 MiB call")
    return budget


def batches(d, budget):
    items = sorted((f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f))),
                   key=lambda f: -os.path.getsize(os.path.join(d, f)))
    calls = []  # [used bytes, [files]]
    for f in items:
        size = os.path.getsize(os.path.join(d, f))
        if size > budget:
            raise SystemExit(f"wheels.py: {f} ({size / MiB:.1f} MiB) exceeds the per-transfer budget "
                             f"({budget / MiB:.1f} MiB): split with a smaller --part-mb")
        for c in calls:
            if c[0] + size <= budget:
                c[0] += size
                c[1].append(f)
                break
        else:
            calls.append([size, [f]])
    for i, (used, files) in enumerate(calls, 1):
        sub = os.path.join(d, f"call{i}")
        os.makedirs(sub, exist_ok=True)
        for f in files:
            shutil.move(os.path.join(d, f), os.path.join(sub, f))
        print(f"call{i}: {used / MiB:.1f} MiB, {len(files)} files: copy {os.path.relpath(sub)}")
    return len(calls)


def join(sources, dest):
    os.makedirs(dest, exist_ok=True)
    files = {}
    for src in sources:
        for root, _, names in os.walk(src):
            for n in names:
                files.setdefault(n, os.path.join(root, n))
    for n, p in files.items():
        if n.endswith(".whl"):
            shutil.copyfile(p, os.path.join(dest, n))
    missing = []
    for n, p in sorted(files.items()):
        if not n.endswith(".whl.sha256"):
            continue
        wheel = n[:-len(".sha256")]
        digest, count = open(p).read().split()
        parts = [f"{wheel}.part{i:02d}" for i in range(int(count))]
        absent = [x for x in parts if x not in files]
        if absent:
            missing += absent
            continue
        target = os.path.join(dest, wheel)
        with open(target + ".tmp", "wb") as out:
            for x in parts:
                with open(files[x], "rb") as f:
                    shutil.copyfileobj(f, out)
        if sha256(target + ".tmp") != digest:
            os.remove(target + ".tmp")
            raise SystemExit(f"wheels.py: {wheel}: the joined parts do not match its SHA-256")
        os.replace(target + ".tmp", target)
        print(f"joined {wheel} from {len(parts)} parts")
    orphans = sorted({m.group("wheel") for n in files if (m := PART.match(n))} -
                     {n[:-len(".sha256")] for n in files if n.endswith(".whl.sha256")})
    if missing or orphans:
        print("wheels.py: incomplete: " + ", ".join(missing + [f"{o}.sha256" for o in orphans]) +
              " not found (copy every callN folder first)", file=sys.stderr)
        sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("dir")
    s.add_argument("--part-mb", type=float, default=30.0)
    s.add_argument("--fit", action="store_true", help="parts no larger than the measured per-transfer budget")
    s.add_argument("--reserve-mb", type=float, default=0.0, help="with --fit: room kept for other copied folders")
    b = sub.add_parser("batches")
    b.add_argument("dir")
    b.add_argument("--budget-mb", type=float, help="MiB a transfer may hold beside the tree (default: measured)")
    b.add_argument("--reserve-mb", type=float, default=0.0, help="room kept in each transfer for other copied folders")
    j = sub.add_parser("join")
    j.add_argument("sources", nargs="+")
    j.add_argument("--to", required=True)
    a = ap.parse_args()
    for d in ([a.dir] if a.cmd != "join" else a.sources):
        if not os.path.isdir(d):
            raise SystemExit(f"wheels.py: {d}: no such folder")
    if a.cmd == "split":
        if a.part_mb <= 0:
            ap.error("--part-mb must be > 0")
        part = int(a.part_mb * MiB)
        split(a.dir, min(part, measured_budget(int(a.reserve_mb * MiB))) if a.fit else part)
    elif a.cmd == "batches":
        batches(a.dir, int(a.budget_mb * MiB) if a.budget_mb is not None else measured_budget(int(a.reserve_mb * MiB)))
    else:
        join(a.sources, a.to)


if __name__ == "__main__":
    main()
