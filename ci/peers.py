#!/usr/bin/env python3
"""Same-process comparison on one GPU: mixbench's ops through torch.ops.mixbench (python/mixbench_ops)
and every peer, timed by the same code on the same inputs, eager and captured in a CUDA graph.

  simple_gla        ours | flash-linear-attention with its Triton kernels (backend dispatch off) |
                    flash-linear-attention as installed (the backend its dispatch picked is recorded)
  gated_delta_rule  the same, and FlashQLA (flash_qla.chunk_gated_delta_rule, TileLang) when importable
  attention         ours (causal) | LibTorch SDPA forced to FlashAttention, to cuDNN, and SDPA's own
                    choice | flash-attn's flash_attn_func when importable
  gla, kda, delta_rule (with --ops): ours | flash-linear-attention's Triton kernels, as installed

flash-linear-attention 0.6.0 (fla/backends.py) picks a backend at each call: the first available and
enabled one whose verifier accepts the call (FlashQLA for chunk_gated_delta_rule on Hopper when
flash_qla imports), else its Triton kernels. A backend's switch is its env_var (FLA_FLASH_QLA=0) and
FLA_<TYPE>, read at each call; FLA_DISABLE_BACKEND_DISPATCH=1, read at import, turns dispatch off for
the whole process. "fla-triton" sets every switch of the op's backends to 0 around its calls (its
graph is captured inside), so both FLA sides run in this one process; each row records the backend
that FLA's own selection rule picks for the call.

Shapes: B·T = 65536 tokens (B = 65536 / T), H = 16, K = V = D = 128, bf16 q / k / v (and beta), fp32
log gates g = logsigmoid(randn) / 16; q and k L2-normalised for the delta rules. Phases: fwd, and
fwd_bwd = forward then torch.autograd.grad of o against a fixed random do (final-state gradient
none) into every differentiable input. output_final_state is off or on for every side of a row
alike (--final-state). Inputs of ≥ 256 MiB a tensor (far beyond the 50 MB L2) are not rotated.

Method, per (op, phase, T, final state, side): a first call outside any timing (Triton JIT and
autotuning, TileLang compilation, cuBLAS / cuDNN plans, our one-time device probes); eager = the
call from Python, bracketed by CUDA events, synchronised after each, median of --reps (launch cost
included, as a training loop pays it without graphs); graph = three calls on a side stream, a
torch.cuda.CUDAGraph capture of one call, three replays, then the median of --reps replays each
bracketed by events. A side that fails to import, run or be captured is recorded with its error.
Each side's o is compared with ours (relative RMS difference) on the first forward.

The report (ci/compare.py builds it from these timings; schema in its docstring): GPU, driver,
versions, the backend each side ran, eager and graph ms per side, ratios side / ours (graph against
graph as the headline, eager beside), the fastest peer per row, FLOPs, bytes and their shares of the
bf16 matmul and device-to-device copy ceilings measured in this process.

Usage: ci/peers.py --out comparison.json [--ops simple_gla,gated_delta_rule,attention]
                   [--lengths 2048,8192,32768] [--final-state off,on] [--phases fwd,fwd_bwd]
                   [--reps 20] [--budget-s 480] [--timings raw.json]
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "ci"))
import compare  # noqa: E402

# The shape of every row (B = TOKENS / T); --tokens / --heads / --dim and --device cpu make the small
# CPU run the tests use (no CUDA graphs there: each side records why).
CFG = dict(tokens=65536, heads=16, dim=128, device="cuda")


def short_error(e):
    return f"{type(e).__name__}: {e}".strip()[:600]


# ------------------------------------------------------------------ environment
def environment(torch):
    cuda = CFG["device"] == "cuda"
    env = dict(gpu=torch.cuda.get_device_name(0) if cuda else "cpu", torch=torch.__version__,
               cuda_runtime=torch.version.cuda, cudnn=torch.backends.cudnn.version() if cuda else None,
               python=sys.version.split()[0])
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        env["driver"], env["gpu_memory"] = (x.strip() for x in q.stdout.splitlines()[0].split(",")[:2])
    except Exception as e:  # no nvidia-smi: the report says so
        env["driver"] = None
        env["driver_error"] = short_error(e)
    versions = {}
    for mod in ("triton", "fla", "flash_qla", "tilelang", "flash_attn"):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", "unknown")
        except Exception as e:
            versions[mod] = None
            versions[mod + "_import_error"] = short_error(e)
    env["versions"] = versions
    try:
        env["mixbench_commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                                text=True, timeout=10).stdout.strip() or None
    except Exception:
        env["mixbench_commit"] = None
    return env


# ------------------------------------------------------------------ timing
def sync(torch):
    if CFG["device"] == "cuda":
        torch.cuda.synchronize()


def median_ms(torch, run, reps):
    times = []
    for _ in range(reps):
        if CFG["device"] != "cuda":
            t0 = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - t0))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_eager(torch, fn, reps):
    fn()
    sync(torch)
    return median_ms(torch, fn, reps)


def time_graph(torch, fn, reps):
    if CFG["device"] != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    ms = median_ms(torch, graph.replay, reps)
    del graph
    return ms


def ceilings(torch, reps):
    """bf16 matmul 8192³ (TFLOP/s) and a 1 GiB device-to-device copy (GB/s, read + write)."""
    out = {}
    dev, m = CFG["device"], (8192 if CFG["device"] == "cuda" else 256)
    try:
        a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
        b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
        c = torch.empty_like(a)
        ms = time_eager(torch, lambda: torch.matmul(a, b, out=c), reps)
        out["matmul_bf16_TFLOPs"] = 2 * m ** 3 / ms / 1e9
        out["matmul_bf16_shape"] = f"{m}x{m}x{m}"
        del a, b, c
    except Exception as e:
        out["matmul_error"] = short_error(e)
    try:
        n = 1 << (30 if dev == "cuda" else 24)
        src = torch.empty(n, device=dev, dtype=torch.uint8).random_(0, 255)
        dst = torch.empty_like(src)
        ms = time_eager(torch, lambda: dst.copy_(src), reps)
        out["copy_GBps"] = 2 * n / ms / 1e6
        out["copy_bytes"] = n
        del src, dst
    except Exception as e:
        out["copy_error"] = short_error(e)
    free_memory(torch)
    return out


def free_memory(torch):
    if CFG["device"] == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ inputs
def make_inputs(torch, op, T, grad):
    import torch.nn.functional as F
    B, H, D, bf, dev = CFG["tokens"] // T, CFG["heads"], CFG["dim"], torch.bfloat16, CFG["device"]
    gen = torch.Generator(device=dev).manual_seed(T)
    r = lambda *s, dtype=bf: torch.randn(*s, device=dev, dtype=dtype, generator=gen)  # noqa: E731
    x = dict(q=r(B, T, H, D), k=r(B, T, H, D), v=r(B, T, H, D))
    if op in ("delta_rule", "gated_delta_rule", "kda"):
        x["q"] = F.normalize(x["q"].float(), dim=-1).to(bf)
        x["k"] = F.normalize(x["k"].float(), dim=-1).to(bf)
        x["beta"] = torch.sigmoid(r(B, T, H))
    if op in ("simple_gla", "gated_delta_rule"):
        x["g"] = F.logsigmoid(r(B, T, H, dtype=torch.float32)) / 16
    if op in ("gla", "kda"):
        x["g"] = F.logsigmoid(r(B, T, H, D, dtype=torch.float32)) / 16
    for t in x.values():
        t.requires_grad_(grad)
    return x


# ------------------------------------------------------------------ sides
def fla_registries(op):
    """flash-linear-attention's backend registries that can take over `op`'s chunk function: the
    operation's (fla.ops.<op>.backends) and the function's own (@dispatch without a name)."""
    import fla  # noqa: F401  (not installed: the row records the ImportError)
    from fla import backends as fb
    mod, fname = FLA_FUNCS[op]
    __import__(mod, fromlist=[fname])
    regs = []
    try:
        regs.append(fb._load_operation_registry(op))
    except ModuleNotFoundError as e:
        if not (e.name or "").endswith("backends"):
            raise
    for fn, reg in getattr(fb, "_function_registries", {}).items():
        if getattr(fn, "__name__", None) == fname and reg not in regs:
            regs.append(reg)
    return regs


@contextlib.contextmanager
def fla_dispatch_off(op):
    """flash-linear-attention with its backend dispatch off for `op`: every registered backend's switch
    (its env_var and FLA_<TYPE>) set to 0 for the duration; FLA 0.6 reads them at each call."""
    names = {"FLA_FLASH_QLA", "FLA_TILELANG", "FLA_FLASH_KDA", "FLA_GLUON"}
    with contextlib.suppress(Exception):
        for reg in fla_registries(op):
            for be in reg._get_sorted_backends():
                names.add(f"FLA_{be.backend_type.upper()}")
                if getattr(be, "env_var", None):
                    names.add(be.env_var)
    saved = {n: os.environ.get(n) for n in names}
    for n in names:
        os.environ[n] = "0"
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def fla_backend(op, args, kwargs):
    """The backend flash-linear-attention's dispatch picks for this call (its own rule: the first
    available, enabled backend whose verifier accepts the call), else its Triton kernels."""
    fname = FLA_FUNCS[op][1]
    regs = fla_registries(op)
    from fla import backends as fb
    if getattr(fb, "_DISPATCH_DISABLED", False):
        return "triton (FLA_DISABLE_BACKEND_DISPATCH=1)"
    for reg in regs:
        for be in reg._get_sorted_backends():
            if not (be.is_available() and be.is_enabled()):
                continue
            ok, _ = be.verify(fname, *args, **kwargs)
            if ok and be.get_implementation(fname) is not None:
                return be.backend_type
    return "triton"


FLA_FUNCS = {"simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"), "gla": ("fla.ops.gla", "chunk_gla"),
             "delta_rule": ("fla.ops.delta_rule", "chunk_delta_rule"),
             "gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
             "kda": ("fla.ops.kda", "chunk_kda")}
LINEAR_ARGS = {"simple_gla": ("q", "k", "v", "g"), "gla": ("q", "k", "v", "g"), "delta_rule": ("q", "k", "v", "beta"),
               "gated_delta_rule": ("q", "k", "v", "g", "beta"), "kda": ("q", "k", "v", "g", "beta")}


class Side:
    """A callable implementation: call(x, final_state) -> o; backend(x, final_state) -> str."""

    def __init__(self, name, call, backend, context=contextlib.nullcontext):
        self.name, self.call, self.backend, self.context = name, call, backend, context


def sides_for(torch, op):
    import torch.nn.functional as F
    out = []

    def ours_call(x, fs):
        import mixbench_ops as mb
        if op == "attention":
            return mb.attention(x["q"], x["k"], x["v"])
        fn = {"simple_gla": mb.chunk_simple_gla, "gla": mb.chunk_gla, "delta_rule": mb.chunk_delta_rule,
              "gated_delta_rule": mb.chunk_gated_delta_rule, "kda": mb.chunk_kda}[op]
        return fn(*(x[n] for n in LINEAR_ARGS[op]), output_final_state=fs)[0]

    def ours_backend(x, fs):
        torch.ops.mixbench._kernel_notes()
        with torch.no_grad():
            ours_call(x, fs)
        return "mixbench:" + (torch.ops.mixbench._kernel_notes() or "?")

    out.append(Side("mixbench", ours_call, ours_backend))
    if op in FLA_FUNCS:
        mod, fname = FLA_FUNCS[op]

        def fla_call(x, fs):
            fn = getattr(__import__(mod, fromlist=[fname]), fname)
            return fn(*(x[n] for n in LINEAR_ARGS[op]), output_final_state=fs)[0]

        def fla_args(x, fs):
            return [x[n] for n in LINEAR_ARGS[op]], dict(output_final_state=fs)

        def triton_backend(x, fs):
            with fla_dispatch_off(op):
                return fla_backend(op, *fla_args(x, fs))

        out.append(Side("fla-triton", fla_call, triton_backend, lambda: fla_dispatch_off(op)))
        out.append(Side("fla-installed", fla_call, lambda x, fs: fla_backend(op, *fla_args(x, fs))))
    if op == "gated_delta_rule":
        def qla_call(x, fs):
            import flash_qla
            return flash_qla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                                    output_final_state=fs)[0]
        out.append(Side("flash-qla", qla_call, lambda x, fs: "flash_qla (TileLang)"))
    if op == "attention":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(x):
            return F.scaled_dot_product_attention(x["q"].transpose(1, 2), x["k"].transpose(1, 2),
                                                  x["v"].transpose(1, 2), is_causal=True).transpose(1, 2)

        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            out.append(Side(name, lambda x, fs: sdpa(x), lambda x, fs, n=name: n,
                            lambda b=backend: sdpa_kernel([b])))
        out.append(Side("sdpa-auto", lambda x, fs: sdpa(x), lambda x, fs: "sdpa (LibTorch's choice)"))

        def fa_call(x, fs):
            from flash_attn import flash_attn_func
            return flash_attn_func(x["q"], x["k"], x["v"], causal=True)
        out.append(Side("flash-attn", fa_call, lambda x, fs: "flash_attn_func"))
    return out


def runner(torch, side, x, fs, phase):
    """The timed callable: forward, or forward then autograd.grad into every differentiable input."""
    if phase == "fwd":
        def fwd():
            with torch.no_grad():
                side.call(x, fs)
        return fwd
    leaves = [t for t in x.values() if t.requires_grad]
    # o has v's shape [B,T,H,V] (q's for attention, where V = D): one fixed gradient for every side
    gen = torch.Generator(device=CFG["device"]).manual_seed(1)
    do = torch.randn(x["v"].shape, device=CFG["device"], dtype=x["v"].dtype, generator=gen)

    def fwd_bwd():
        o = side.call(x, fs)
        torch.autograd.grad(o, leaves, do)
    return fwd_bwd


def rel_rms(a, b):
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def measure(torch, args, sides_cache, rows, deadline, saved=lambda: None):
    """Appends one row per side to `rows`, calling saved() after each (the files stay current)."""
    order = [(fs, op, phase, T) for fs in args.final_state for op in args.ops for phase in args.phases
             for T in args.lengths]
    for fs, op, phase, T in order:
        if op == "attention" and fs:
            continue  # softmax attention has no final state
        if op not in sides_cache:
            sides_cache[op] = sides_for(torch, op)
        ref_o = None
        x = None
        for side in sides_cache[op]:
            row = dict(op=op, phase=phase, T=T, B=CFG["tokens"] // T, H=CFG["heads"], D=CFG["dim"], dtype="bf16",
                       output_final_state=bool(fs), side=side.name)
            if time.time() > deadline:
                row.update(status="skipped", error="time budget (--budget-s) spent")
                rows.append(row)
                saved()
                continue
            try:
                if x is None:
                    x = make_inputs(torch, op, T, grad=(phase == "fwd_bwd"))
                with side.context():
                    row["backend"] = side.backend(x, fs)
                    with torch.no_grad():
                        o = side.call(x, fs)
                    sync(torch)
                    if side.name == "mixbench":
                        ref_o = o.float()
                    elif ref_o is not None:
                        row["o_rel_rms_vs_mixbench"] = rel_rms(o, ref_o)
                    del o
                    fn = runner(torch, side, x, fs, phase)
                    row["eager_ms"] = time_eager(torch, fn, args.reps)
                    try:
                        row["graph_ms"] = time_graph(torch, fn, args.reps)
                    except Exception as e:
                        row["graph_error"] = short_error(e)
                        with contextlib.suppress(Exception):
                            sync(torch)
                row["status"] = "ok"
            except Exception as e:
                row.update(status="error", error=short_error(e))
                with contextlib.suppress(Exception):
                    sync(torch)
            rows.append(row)
            print(json.dumps(row), flush=True)
            saved()
            free_memory(torch)
        del x
        free_memory(torch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the comparison report (JSON)")
    ap.add_argument("--timings", help="also write the raw timings here (ci/compare.py's input)")
    ap.add_argument("--ops", default="simple_gla,gated_delta_rule,attention")
    ap.add_argument("--lengths", default="2048,8192,32768")
    ap.add_argument("--phases", default="fwd,fwd_bwd")
    ap.add_argument("--final-state", default="off,on", help="output_final_state values, e.g. off,on")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=480, help="rows not started by then are recorded as skipped")
    ap.add_argument("--tokens", type=int, default=CFG["tokens"], help="B·T of every row")
    ap.add_argument("--heads", type=int, default=CFG["heads"])
    ap.add_argument("--dim", type=int, default=CFG["dim"], help="K = V = D")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a small run without graphs")
    a = ap.parse_args()
    known = {"simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda", "attention"}
    a.ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in a.ops if o not in known]
    if bad:
        ap.error(f"unknown op(s) {bad}; known: {sorted(known)}")
    a.phases = [p for p in a.phases.split(",") if p]
    if any(p not in ("fwd", "fwd_bwd") for p in a.phases):
        ap.error("--phases takes fwd and/or fwd_bwd")
    try:
        a.lengths = [int(t) for t in a.lengths.split(",") if t]
    except ValueError:
        ap.error("--lengths takes integers")
    if a.tokens <= 0 or a.heads <= 0 or a.dim <= 0:
        ap.error("--tokens, --heads and --dim must be > 0")
    if any(t <= 0 or a.tokens % t for t in a.lengths):
        ap.error(f"--lengths must divide --tokens ({a.tokens})")
    CFG.update(tokens=a.tokens, heads=a.heads, dim=a.dim, device=a.device)
    fs_map = {"off": False, "on": True}
    if any(f not in fs_map for f in a.final_state.split(",")):
        ap.error("--final-state takes off and/or on")
    a.final_state = [fs_map[f] for f in a.final_state.split(",")]
    start = time.time()

    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("peers.py: no CUDA device (--device cpu for the small CPU run)")
    doc = dict(kind="peer_timings", environment=environment(torch), settings=dict(
        tokens=a.tokens, H=a.heads, D=a.dim, device=a.device, dtype="bf16", reps=a.reps, ops=a.ops, lengths=a.lengths, phases=a.phases,
        final_state=a.final_state))
    try:
        import mixbench_ops
        doc["environment"]["mixbench_library"] = mixbench_ops.load()
    except Exception as e:
        doc["environment"]["mixbench_library_error"] = short_error(e)
    doc["ceilings"] = ceilings(torch, a.reps)
    print(json.dumps(dict(environment=doc["environment"], ceilings=doc["ceilings"])), flush=True)
    doc["rows"] = []

    def save():
        # after every row, so that a run stopped from outside leaves its report so far
        doc["wall_s"] = time.time() - start
        if a.timings:
            compare.write_json(a.timings, doc)
        report = compare.build_report(doc)
        compare.write_json(a.out, report)
        return report

    save()
    measure(torch, a, {}, doc["rows"], start + a.budget_s, save)
    print(compare.table(save()))


if __name__ == "__main__":
    main()
