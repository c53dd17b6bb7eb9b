"""Compare the machine code of CUDA kernels between two sets of object files, kernel by kernel.

For moving kernels between files without changing them: every kernel (by symbol, with the per-file
name of the anonymous namespace made neutral) must exist on both sides with the same SASS and the
same resource usage (registers, shared / constant / local memory). Needs cuobjdump (CUOBJDUMP, PATH,
/usr/local/cuda/bin, or the one shipped with triton).
Usage: python3 ci/kernels/sass_compare.py --before a.o [b.o ...] --after c.o [d.o ...]
Exit status 0 when everything matches, 1 otherwise (the differing kernels are listed).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

# nvcc names an anonymous namespace after its file: 49_GLOBAL__N__38b07729_16_chunk_kernels_cu_7c50231c
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}")


def cuobjdump():
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found and os.path.exists("/usr/local/cuda/bin/cuobjdump"):
        found = "/usr/local/cuda/bin/cuobjdump"
    if not found:
        try:
            import triton
            cand = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))
            found = cand[0] if cand else None
        except ImportError:
            found = None
    if not found:
        sys.exit("sass_compare.py: cuobjdump not found (set CUOBJDUMP)")
    return found


def neutral(text):
    return ANON.sub("ANON", text)


def kernels(objs, tool):
    """{kernel: (sass lines, resource usage line)} over the object files."""
    out = {}
    for obj in objs:
        sass = subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([tool, "-res-usage", obj], check=True, capture_output=True, text=True).stdout
        usage = {}
        for m in re.finditer(r"Function (\S+):\s*\n\s*(REG:.*)", res):
            usage[neutral(m.group(1))] = m.group(2).strip()
        for part in re.split(r"\n\s*Function : ", sass)[1:]:
            name, body = part.split("\n", 1)
            name = neutral(name.strip())
            # the listing stops at the next section header of the dump
            body = body.split("\n\t\t..........")[0]
            if name in out:
                sys.exit(f"sass_compare.py: {name} appears twice in {objs}")
            # the listing pads its columns to the widest line of the file: compare with single spaces
            out[name] = ([neutral(" ".join(line.split())) for line in body.splitlines() if line.strip()],
                         usage.get(name, "?"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    args = ap.parse_args()
    tool = cuobjdump()
    a, b = kernels(args.before, tool), kernels(args.after, tool)
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in b:
            print(f"only before: {name}")
        elif name not in a:
            print(f"only after:  {name}")
        elif a[name] != b[name]:
            print(f"different:   {name}\n  before {a[name][1]}\n  after  {b[name][1]}")
        else:
            continue
        bad += 1
    same = len(set(a) & set(b)) - sum(1 for n in set(a) & set(b) if a[n] != b[n])
    print(f"{same} kernels identical (SASS and resource usage), {bad} not")
    return 1 if bad or not a else 0


if __name__ == "__main__":
    sys.exit(main())
