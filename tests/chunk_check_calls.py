"""ci/kernels/chunk_check.py drives the tensor-core chunk kernels through ctypes, which only runs on a
GPU. This test runs its checks, its sanitizer run and its backward timing on the CPU against a
stand-in library that checks every call against the C entry points of ci/kernels/chunk_capi.cu
(the name exists, the argument count matches, pointers arrive as pointers, floats as c_float, ints
as ints) and records which entry points were called, so an entry point or script changed on one side
only fails here instead of on the GPU machine. The kernels' numbers are not checked here (the
stand-in computes nothing); chunk_check.py does that on a GPU. It also checks that the kernel files
chunk_check.py builds define every function of chunk_kernels.h."""
import ctypes
import os
import re
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "ci", "kernels"))
import chunk_check as cc  # noqa: E402


def entry_points():
    """{name: [kind of each parameter]} from the extern "C" definitions, kind in pointer/float/int."""
    src = open(os.path.join(ROOT, "ci", "kernels", "chunk_capi.cu")).read()
    eps = {}
    for m in re.finditer(r"\bint (ck_\w+)\(([^)]*)\)\s*\{", src):
        kinds = []
        for par in (x.strip() for x in m.group(2).split(",") if x.strip()):
            kinds.append("pointer" if "*" in par else "float" if par.startswith("float") else
                         "int" if par.startswith("int") else "?" + par)
        eps[m.group(1)] = kinds
    return eps


class StandIn:
    def __init__(self, eps):
        self.eps, self.calls, self.errors = eps, {}, []

    def __getattr__(self, name):
        def fn(*args):
            kinds = self.eps.get(name)
            if kinds is None:
                self.errors.append(f"{name}: no such entry point")
            elif len(args) != len(kinds):
                self.errors.append(f"{name}: {len(args)} arguments, the entry point takes {len(kinds)}")
            else:
                for i, (a, k) in enumerate(zip(args, kinds)):
                    ok = (isinstance(a, ctypes.c_void_p) if k == "pointer" else isinstance(a, ctypes.c_float)
                          if k == "float" else isinstance(a, int) and not isinstance(a, bool) if k == "int" else False)
                    if not ok:
                        self.errors.append(f"{name}: argument {i} is {type(a).__name__}, the entry point wants {k}")
            self.calls[name] = self.calls.get(name, 0) + 1
            return 1 if name == "ck_layout_ok" else 0
        return fn


def sources_define_interface():
    """Every function chunk_kernels.h declares is defined in exactly one of the translation units
    chunk_check.py builds (so a kernel file left out of the build line fails here, not at link time
    on the GPU machine)."""
    header = open(os.path.join(ROOT, "mixers", "linear", "chunk_kernels.h")).read()
    declared = set(re.findall(r"^(?:void|bool) (\w+)\(", header, re.M))
    texts = {os.path.basename(f): open(f).read() for f in cc.kernel_sources()}
    errors = [] if len(declared) >= 10 else [f"found only {len(declared)} functions in chunk_kernels.h"]
    for name in sorted(declared):
        where = [f for f, t in texts.items() if re.search(rf"^(?:void|bool) {name}\(", t, re.M)]
        if len(where) != 1:
            errors.append(f"{name}: defined in {where or 'none'} of {sorted(texts)}")
    return errors


def main():
    eps = entry_points()
    assert len(eps) >= 10, f"found only {len(eps)} entry points in chunk_capi.cu"
    lib = StandIn(eps)
    cc.L, cc.DEV = lib, "cpu"
    cc.stream = lambda: ctypes.c_void_p(0)
    cc.time_it = lambda fn, sets, *a, **k: (fn(sets[0]), 0.0)[1]
    torch.cuda.synchronize = lambda *a, **k: None
    torch.manual_seed(0)

    cases = []
    cc.check(cases, quick=True)
    cc.check_tunings([])
    cc.sanitize_run()
    cc.POISON = False
    q, k, v, g, beta, _ = cc.inputs(2, 130, 2, 64, 64, torch.bfloat16, 16, seed=1)
    qn, kn = (torch.nn.functional.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
    row = {}
    cc.backward_parts(row, dict(q=q, k=k, v=v, g=g, beta=beta.bfloat16(), qn=qn, kn=kn, do=torch.randn_like(v)),
                      130, 0.125)
    cc.L.ck_layout_ok()

    failures = list(dict.fromkeys(lib.errors)) + sources_define_interface()
    # every entry point is exercised by the script
    failures += [f"{n}: never called by chunk_check.py" for n in eps if n not in lib.calls]
    # quick mode: bf16 × (K, V) ∈ {(64, 128), (128, 128)} × T ∈ {1, 65, 200} × h0 × gate
    if len(cases) != 24:
        failures.append(f"{len(cases)} quick cases, expected 24")
    want = {"o", "ht", "dq", "dg", "cumsum", "decay_grad", "decay_grad_cast", "dots_same", "dots_dg", "gdn_o", "gdn_dq",
            "gdn_dbeta", "gdn_decay_grad", "gdn_dots_same", "gdn_dots_dg", "gdn_bwd_du", "gdn_x"}
    for c in cases:
        missing = want - set(c["errors"])
        if missing:
            failures.append(f"case {c['K']}x{c['V']} T={c['T']} h0={c['h0']}: no {sorted(missing)}")
            break
    parts = {"sgla_dqkv", "sgla_dqkv_dots", "sgla_decay_grad_dots", "gdn_wy_bwd", "gdn_dqkv_dots", "gdn_decay_grad_dots"}
    if not parts <= set(row.get("bwd_part_ms", {})):
        failures.append(f"--bwd-parts timed {sorted(row.get('bwd_part_ms', {}))}")
    print("entry points:", {n: lib.calls.get(n, 0) for n in sorted(eps)})
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("chunk_check.py's calls match chunk_capi.cu")


if __name__ == "__main__":
    main()
