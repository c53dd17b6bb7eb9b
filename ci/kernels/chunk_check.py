"""Check and time the tensor-core chunk kernels (mixers/linear/chunk_*.cu) without the harness.

Builds them into a shared library with nvcc, then through ctypes:
  * checks simple_gla forward + backward (o, ht, dq, dk, dv, dg, dh0) and the gated delta rule
    forward (o, ht) against float64 per-token recurrences (autograd for the gradients), and the
    delta rule's per-chunk inverse X = (I + A)^-1 against float64, on small
    shapes: K, V in {64, 128}, T in {1, 63, 64, 65, 200}, with and without h0 / dht, bf16 and fp16,
    outputs poisoned with NaN before each call;
  * times the forwards (and our simple_gla backward) at B*T = 64K, H = 16, K = V = 128, bf16, next
    to flash-linear-attention's chunk kernels when it is importable, CUDA events, median of 20,
    two input sets rotated.
Usage: python3 ci/kernels/chunk_check.py [--out results.json] [--lib /tmp/libchunk.so] [--no-time]
"""
import argparse
import ctypes
import glob
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernel_sources():
    """The kernels' translation units: one per kernel family plus the launch choices (chunk_kernels.h)."""
    return sorted(glob.glob(os.path.join(ROOT, "mixers/linear/chunk_*.cu")))


def build(lib):
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else "nvcc")
    cmd = [nvcc, "-O3", "-arch=sm_90", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-I", ROOT,
           "--expt-relaxed-constexpr", "-lineinfo",
           *kernel_sources(), os.path.join(ROOT, "ci/kernels/chunk_capi.cu"), "-o", lib]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(lib)


L = None
# where the tensors live; a test swaps in "cpu" with a stand-in library to check the calls' arguments
DEV = "cuda"


def p(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def call(name, *args):
    rc = getattr(L, name)(*args)
    if rc != 0:
        raise RuntimeError(name + " failed")


POISON = True


def poison(*shape, dtype):
    if not POISON:
        return torch.empty(shape, dtype=dtype, device=DEV)
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def chunk_cumsum(g, T):
    B, _, H = g.shape
    NT = (T + 63) // 64
    gp = torch.zeros(B, NT * 64, H, device=g.device, dtype=torch.float32)
    gp[:, :T] = g.float()
    return gp.view(B, NT, 64, H).cumsum(2).view(B, NT * 64, H).contiguous()


def kcumsum(g, T):
    """chunk_cumsum through the kernel (g fp32 [B,T,H])."""
    B, _, H = g.shape
    NT = (T + 63) // 64
    gf = g.float().contiguous()
    b = poison(B, NT * 64, H, dtype=torch.float32)
    call("ck_cumsum", p(gf), p(b), B, T, H, stream())
    return b


# Launch choices (walk V tile, output CTAs per chunk: see Tuning in chunk_kernels.h) the tuning sweep
# and the tuning check go through; (0, 0) is the built-in rule.
TUNINGS = [(bv, sp) for bv in (32, 64) for sp in (1, 2)]


def set_tuning(t):
    call("ck_set_tuning", *t)


def dims(q, v):
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[-1]


def fp16(t):
    return 1 if t.dtype == torch.float16 else 0


def sgla_fwd(q, k, v, g, scale, h0):
    B, T, H, K, V = dims(q, v)
    NT = (T + 63) // 64
    b = kcumsum(g, T)
    hs = poison(B, H, NT, K, V, dtype=q.dtype)
    ht = poison(B, H, K, V, dtype=torch.float32)
    o = poison(B, T, H, V, dtype=q.dtype)
    call("ck_walk_fwd", fp16(q), p(k), p(v), p(None), p(b), p(h0), p(hs), p(None), p(ht), B, T, H, K, V, stream())
    call("ck_output", fp16(q), p(q), p(k), p(v), p(b), p(hs), p(o), ctypes.c_float(scale), B, T, H, K, V, stream())
    return o, ht, hs, b


def sgla_fused(q, k, v, g, scale, h0):
    B, T, H, K, V = dims(q, v)
    b = kcumsum(g, T)
    ht = poison(B, H, K, V, dtype=torch.float32)
    o = poison(B, T, H, V, dtype=q.dtype)
    call("ck_fused", fp16(q), p(q), p(k), p(v), p(None), p(b), p(h0), p(o), p(ht), ctypes.c_float(scale),
         B, T, H, K, V, stream())
    return o, ht


def sgla_bwd(q, k, v, g, scale, h0, do, dht, fwd=None, errs=None):
    B, T, H, K, V = dims(q, v)
    NT = (T + 63) // 64
    o, ht, hs, b = fwd if fwd is not None else sgla_fwd(q, k, v, g, scale, h0)
    dhs = poison(*hs.shape, dtype=q.dtype)
    dh0 = poison(B, H, K, V, dtype=torch.float32)
    call("ck_walk_bwd", fp16(q), p(q), p(do), p(b), p(dht), p(dhs), p(dh0), ctypes.c_float(scale), B, T, H, K, V,
         stream())
    dqf = poison(B, T, H, K, dtype=torch.float32)
    dkf = poison(B, T, H, K, dtype=torch.float32)
    dv = poison(B, T, H, V, dtype=q.dtype)
    y = poison(B, T, H, dtype=torch.float32)
    z = poison(B, NT, H, dtype=torch.float32)
    call("ck_dqkv", fp16(q), p(q), p(k), p(v), p(do), p(b), p(hs), p(dhs), p(dqf), p(dkf), p(dv), p(y), p(z),
         ctypes.c_float(scale), B, T, H, K, V, stream())
    if errs is not None:
        errs.update(decay_grad_errors(q, dqf, k, dkf, y, z))
    dg, dq, dk = kdecay_grad(q, dqf, k, dkf, y, z)
    if errs is not None:
        errs.update(dots_errors(q, k, v, do, b, hs, dhs, scale, dq, dk, dv, y, z, dg))
    return dq, dk, dv, dg, dh0


def decay_grad(q, dqf, k, dkf, y, z, x2=None):
    """dg from chunk_dqkv's pieces: x_i = q_i·dq_i − k_i·dk_i + y_i (+ x2_i), per chunk
    dg_t = Σ_{i≥t} x_i + Σ_{j<t} y_j + z_c."""
    B, T, H, _ = q.shape
    NT = (T + 63) // 64
    x = torch.zeros(B, NT * 64, H, device=q.device, dtype=dqf.dtype)
    yp = torch.zeros_like(x)
    x[:, :T] = (q.to(dqf.dtype) * dqf).sum(-1) - (k.to(dqf.dtype) * dkf).sum(-1) + y + (x2 if x2 is not None else 0)
    yp[:, :T] = y
    x, yp = x.view(B, NT, 64, H), yp.view(B, NT, 64, H)
    return (x.flip(2).cumsum(2).flip(2) + yp.cumsum(2) - yp + z[:, :, None, :]).view(B, NT * 64, H)[:, :T]


def kdecay_grad(q, dqf, k, dkf, y, z, x2=None, with_dk=True, xdot=None):
    """decay_grad on the kernel: dg (fp32 [B,T,H]), dq and (with_dk) dk rounded to q's dtype; with xdot
    (chunk_dqkv's row dots) only dg."""
    B, T, H, K = q.shape
    dg = poison(B, T, H, dtype=torch.float32)
    dq = poison(B, T, H, K, dtype=q.dtype) if xdot is None else None
    dk = poison(B, T, H, K, dtype=q.dtype) if with_dk and xdot is None else None
    call("ck_decay_grad", fp16(q), p(q), p(dqf), p(k), p(dkf), p(y), p(z), p(x2), p(xdot), p(dg), p(dq), p(dk),
         B, T, H, K, stream())
    return dg, dq, dk


def kdqkv_dots(q, k, v, do, b, hs, dhs, scale, dk_fp32=False, with_dv=True):
    """chunk_dqkv forming the row dots: dq, dk (fp32 with dk_fp32, else q's dtype), dv (None without
    with_dv: the kernel then skips it), y, z, xdot."""
    B, T, H, K, V = dims(q, v)
    NT = (T + 63) // 64
    dq = poison(B, T, H, K, dtype=q.dtype)
    dk = poison(B, T, H, K, dtype=torch.float32 if dk_fp32 else q.dtype)
    dv = poison(B, T, H, V, dtype=q.dtype) if with_dv else None
    y, xdot = poison(B, T, H, dtype=torch.float32), poison(B, T, H, dtype=torch.float32)
    z = poison(B, NT, H, dtype=torch.float32)
    call("ck_dqkv_dots", fp16(q), p(q), p(k), p(v), p(do), p(b), p(hs), p(dhs), p(dk if dk_fp32 else None), p(dq),
         p(None if dk_fp32 else dk), p(dv), p(y), p(z), p(xdot), ctypes.c_float(scale), B, T, H, K, V, stream())
    return dq, dk, dv, y, z, xdot


def dots_errors(q, k, v, do, b, hs, dhs, scale, dq, dk, dv, y, z, dg, x2=None, dk_fp32=False):
    """chunk_dqkv with the row dots against the path without them on the same inputs: dq, dk, dv (when
    given; None: the kernel runs without dv, as the delta rule's backward uses it), y, z must be equal
    (the same fp32 values, rounded the same way); dg through the dots within fp32 sums.
    The dots are the same fp32 products summed in another order, so the difference of the two dg is
    measured against the same sums taken over the terms' magnitudes (dg itself can be exactly 0, e.g.
    T = 1 without a state: q·dq − k·dk cancels)."""
    dq2, dk2, dv2, y2, z2, xdot = kdqkv_dots(q, k, v, do, b, hs, dhs, scale, dk_fp32, with_dv=dv is not None)
    dg2, _, _ = kdecay_grad(q, None, k, None, y2, z2, x2, xdot=xdot)
    pairs = ((dq2, dq), (dk2, dk), (y2, y), (z2, z)) + (((dv2, dv),) if dv is not None else ())
    same = max((a.float() - b_.float()).abs().max().item() for a, b_ in pairs)
    mag = decay_grad(q.abs(), dq.float().abs(), k.abs(), -dk.float().abs(), y.abs(), z.abs(),
                     x2.abs() if x2 is not None else None)
    err = (dg2.double() - dg.double()).norm().item() / max(dg.double().norm().item(), mag.double().norm().item(), 1e-300)
    return {"dots_same": same, "dots_dg": err if torch.isfinite(dg2).all() else float("inf")}


def decay_grad_errors(q, dqf, k, dkf, y, z, x2=None):
    """The decay_grad kernel against the composition above in float64 (dg), and its rounding of dq / dk
    against torch's (must be exact)."""
    dg, dq, dk = kdecay_grad(q, dqf, k, dkf, y, z, x2)
    ref = decay_grad(q.double(), dqf.double(), k.double(), dkf.double(), y.double(), z.double(),
                     x2.double() if x2 is not None else None)
    cast = max((dq.float() - dqf.to(q.dtype).float()).abs().max().item(),
               (dk.float() - dkf.to(q.dtype).float()).abs().max().item())
    return {"decay_grad": rel(dg, ref), "decay_grad_cast": cast}


def gdn_prep(k, v, g, beta, with_x=False):
    """delta_prep: the chunk cumsum b, w, u and (with_x) X = (I + A)^-1 per chunk, fp32 [B,H,NT,64,64]."""
    B, T, H, K, V = dims(k, v)
    NT = (T + 63) // 64
    b = kcumsum(g, T)
    w, u = poison(B, T, H, K, dtype=k.dtype), poison(B, T, H, V, dtype=k.dtype)
    x = poison(B, H, NT, 64, 64, dtype=torch.float32) if with_x else None
    call("ck_prep", fp16(k), p(k), p(v), p(beta.float().contiguous()), p(b), p(w), p(u), p(x), B, T, H, K, V,
         stream())
    return b, w, u, x


def gdn_fwd(q, k, v, g, beta, scale, h0, fused=True):
    B, T, H, K, V = dims(q, v)
    NT = (T + 63) // 64
    b, w, u, _ = gdn_prep(k, v, g, beta)
    ht = poison(B, H, K, V, dtype=torch.float32)
    o = poison(B, T, H, V, dtype=q.dtype)
    if fused:
        call("ck_fused", fp16(q), p(q), p(k), p(u), p(w), p(b), p(h0), p(o), p(ht), ctypes.c_float(scale),
             B, T, H, K, V, stream())
        return o, ht
    hs = poison(B, H, NT, K, V, dtype=q.dtype)
    vn = poison(B, T, H, V, dtype=q.dtype)
    call("ck_walk_fwd", fp16(q), p(k), p(u), p(w), p(b), p(h0), p(hs), p(vn), p(ht), B, T, H, K, V, stream())
    call("ck_output", fp16(q), p(q), p(k), p(vn), p(b), p(hs), p(o), ctypes.c_float(scale), B, T, H, K, V, stream())
    return o, ht


def gdn_bwd_walk(q, k, w, do, dvl, b, scale, dht):
    """Reverse walk of the delta rule's state gradient (the sequential part of the GDN backward)."""
    B, T, H, K, V = dims(q, do)
    NT = (T + 63) // 64
    dhs = poison(B, H, NT, K, V, dtype=q.dtype)
    du = poison(B, T, H, V, dtype=q.dtype)
    dh0 = poison(B, H, K, V, dtype=torch.float32)
    call("ck_walk_bwd_delta", fp16(q), p(q), p(do), p(k), p(w), p(dvl), p(b), p(dht), p(dhs), p(du), p(dh0),
         ctypes.c_float(scale), B, T, H, K, V, stream())
    return dhs, du, dh0


def gdn_bwd(q, k, v, g, beta, scale, h0, do, dht, errs=None):
    """Gated delta rule backward on the kernels (the pipeline of the op's CUDA path): dq, dk, dv, dg,
    dbeta, dh0."""
    B, T, H, K, V = dims(q, v)
    NT = (T + 63) // 64
    b, w, u, X = gdn_prep(k, v, g, beta, with_x=True)
    betaf = beta.float().contiguous()
    hs, vn = poison(B, H, NT, K, V, dtype=q.dtype), poison(B, T, H, V, dtype=q.dtype)
    ht = poison(B, H, K, V, dtype=torch.float32)
    call("ck_walk_fwd", fp16(q), p(k), p(u), p(w), p(b), p(h0), p(hs), p(vn), p(ht), B, T, H, K, V, stream())
    dvl = poison(B, T, H, V, dtype=q.dtype)
    call("ck_dv_local", fp16(q), p(q), p(k), p(do), p(b), p(dvl), ctypes.c_float(scale), B, T, H, K, V, stream())
    dhs, du, dh0 = gdn_bwd_walk(q, k, w, do, dvl, b, scale, dht)
    dqf, dkf = poison(B, T, H, K, dtype=torch.float32), poison(B, T, H, K, dtype=torch.float32)
    y, z = poison(B, T, H, dtype=torch.float32), poison(B, NT, H, dtype=torch.float32)
    call("ck_dqkv", fp16(q), p(q), p(k), p(vn), p(do), p(b), p(hs), p(dhs), p(dqf), p(dkf), p(dvl), p(y), p(z),
         ctypes.c_float(scale), B, T, H, K, V, stream())
    dk, dv = poison(B, T, H, K, dtype=q.dtype), poison(B, T, H, V, dtype=q.dtype)
    dbeta, x2 = poison(B, T, H, dtype=torch.float32), poison(B, T, H, dtype=torch.float32)
    call("ck_wy_bwd", fp16(q), p(k), p(v), p(du), p(hs), p(X), p(betaf), p(b), p(dkf), p(dk), p(dv), p(dbeta),
         p(x2), B, T, H, K, V, stream())
    if errs is not None:
        errs.update({"gdn_" + n: e for n, e in decay_grad_errors(q, dqf, k, dkf, y, z, x2).items()})
    dg, dq, _ = kdecay_grad(q, dqf, k, dkf, y, z, x2, with_dk=False)
    if errs is not None:
        errs.update({"gdn_" + n: e for n, e in
                     dots_errors(q, k, vn, do, b, hs, dhs, scale, dq, dkf, None, y, z, dg, x2, dk_fp32=True).items()})
    return dq, dk, dv, dg, dbeta, dh0


def ref_gdn_bwd_walk(q, k, w, do, dvl, b, scale, dht):
    """float64: dS ← e^{b_L} dS + (scale e^{b} q)ᵀ do − wᵀ du with du = dvl + e^{b_L − b} (k dS), chunk by chunk."""
    B, T, H, K, V = dims(q, do)
    NT = (T + 63) // 64
    pad = lambda x: torch.cat([x.double(), x.new_zeros(B, NT * 64 - T, *x.shape[2:]).double()], 1)
    qp, kp, wp, dop, dvp = (pad(x) for x in (q, k, w, do, dvl))
    bd = b.double()
    dS = dht.double().clone() if dht is not None else qp.new_zeros(B, H, K, V)
    dhs, dup = qp.new_zeros(B, H, NT, K, V), torch.zeros_like(dop)
    for c in reversed(range(NT)):
        sl = slice(c * 64, c * 64 + 64)
        bc = bd[:, sl]
        bL = bc[:, -1:]
        dhs[:, :, c] = dS
        du_c = dvp[:, sl] + (bL - bc).exp()[..., None] * torch.einsum("bthk,bhkv->bthv", kp[:, sl], dS)
        dup[:, sl] = du_c
        dS = (bL[:, 0].exp()[..., None, None] * dS
              + torch.einsum("bthk,bthv->bhkv", qp[:, sl] * (scale * bc.exp())[..., None], dop[:, sl])
              - torch.einsum("bthk,bthv->bhkv", wp[:, sl], du_c))
    return dhs, dup[:, :T], dS


def gdn_bwd_walk_errors(q, k, v, g, beta, scale, dht, gen):
    """The reverse walk on the kernels' w (delta_prep) against float64, random do and dv_local."""
    b, w, _, _ = gdn_prep(k, v, g, beta)
    do, dvl = cotangent(v, gen, v.dtype), cotangent(v, gen, v.dtype)
    dhs, du, dh0 = gdn_bwd_walk(q, k, w, do, dvl, b, scale, dht)
    rdhs, rdu, rdh0 = ref_gdn_bwd_walk(q, k, w, do, dvl, b, scale, dht)
    return {"gdn_bwd_dhs": rel(dhs, rdhs), "gdn_bwd_du": rel(du, rdu), "gdn_bwd_dh0": rel(dh0, rdh0)}


def gdn_x(k, v, g, beta):
    """X = (I + A)^-1 of every chunk, fp32 [B,H,NT,64,64], as delta_prep writes it for the backward."""
    return gdn_prep(k, v, g, beta, with_x=True)[3]


def ref_x(k, g, beta):
    """float64 X = (I + A)^-1 per chunk, A = tril(beta_i (k_i . k_j) e^{b_i - b_j}, -1); rows past T are zero."""
    B, T, H, K = k.shape
    NT = (T + 63) // 64
    b = chunk_cumsum(g, T).double().view(B, NT, 64, H).permute(0, 3, 1, 2)
    kp = torch.zeros(B, NT * 64, H, K, device=k.device, dtype=torch.float64)
    bp = torch.zeros(B, NT * 64, H, device=k.device, dtype=torch.float64)
    kp[:, :T], bp[:, :T] = k.double(), beta.double()
    kc = kp.view(B, NT, 64, H, K).permute(0, 3, 1, 2, 4)
    bc = bp.view(B, NT, 64, H).permute(0, 3, 1, 2)
    decay = (b[..., :, None] - b[..., None, :]).clamp(max=0).exp()
    A = (bc[..., None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(64, device=k.device, dtype=torch.float64).expand_as(A)
    return torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)


def ref_sgla(q, k, v, g, scale, h0):
    B, T, H, K = q.shape
    S = h0.clone() if h0 is not None else q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(out, 1), S


def ref_gdn(q, k, v, g, beta, scale, h0):
    B, T, H, K = q.shape
    S = h0.clone() if h0 is not None else q.new_zeros(B, H, K, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kS = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        u = beta[:, t, :, None] * (v[:, t] - kS)
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(out, 1), S


def rel(a, b):
    a, b = a.double(), b.double()
    d = (a - b).norm() / max(b.norm().item(), 1e-300)
    return float(d) if torch.isfinite(a).all() else float("inf")


def inputs(B, T, H, K, V, dt, gate_div, seed, delta=False):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=DEV, generator=gen)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    if delta:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    g = F.logsigmoid(r(B, T, H)) / gate_div
    beta = torch.sigmoid(r(B, T, H))
    h0 = r(B, H, K, V)
    return [x.to(dt) for x in (q, k, v)] + [g, beta, h0]


def cotangent(like, gen, dt):
    """A random cotangent shaped like `like` from the case's generator, rounded to the dtype the kernel
    receives it in (dt) and returned in like's dtype, so the reference sees exactly the kernel's input."""
    return torch.randn(like.shape, device=like.device, generator=gen).to(dt).to(like.dtype)


def sanitize_run():
    """Every kernel once on small shapes (for compute-sanitizer); outputs must come back finite. The
    backwards run with an errs dict so that chunk_dqkv with the row dots and decay_grad run too."""
    ok = True
    # the built-in launch choices on these shapes (V tiles of 32, one output CTA per chunk) and the others
    for tuning, K, V, T in [(t, K, V, T) for t in ((0, 0), (64, 2))
                            for K, V in ((64, 128), (128, 128), (128, 64)) for T in (65, 130)]:
        set_tuning(tuning)
        q, k, v, g, beta, h0 = inputs(2, T, 3, K, V, torch.bfloat16, 4, seed=T + K)
        # the delta rule needs unit-norm keys (as its layers give it) to stay bounded
        qd, kd, vd, gd, betad, _ = inputs(2, T, 3, K, V, torch.bfloat16, 4, seed=T + K, delta=True)
        scale = K ** -0.5
        fwd = sgla_fwd(q, k, v, g, scale, h0)
        outs = dict(zip(("o", "ht"), fwd[:2]))
        outs.update(zip(("o_fused", "ht_fused"), sgla_fused(q, k, v, g, scale, h0)))
        outs.update(zip(("dq", "dk", "dv", "dg", "dh0"),
                        sgla_bwd(q, k, v, g, scale, h0, torch.randn_like(v), torch.randn_like(h0), fwd, errs={})))
        outs.update(zip(("gdn_o", "gdn_ht"), gdn_fwd(qd, kd, vd, gd, betad, scale, h0)))
        outs.update(zip(("gdn_o_split", "gdn_ht_split"), gdn_fwd(qd, kd, vd, gd, betad, scale, h0, False)))
        bd, wd, _, _ = gdn_prep(kd, vd, gd, betad)
        outs.update(zip(("gdn_dq", "gdn_dk", "gdn_dv", "gdn_dg", "gdn_dbeta", "gdn_dh0"),
                        gdn_bwd(qd, kd, vd, gd, betad, scale, h0, torch.randn_like(vd), torch.randn_like(h0), errs={})))
        outs.update(zip(("gdn_bwd_dhs", "gdn_bwd_du", "gdn_bwd_dh0"),
                        gdn_bwd_walk(qd, kd, wd, torch.randn_like(vd), torch.randn_like(vd), bd, scale,
                                     torch.randn_like(h0))))
        outs["gdn_x"] = gdn_x(kd, vd, gd, betad)
        torch.cuda.synchronize()
        bad = [n for n, x in outs.items() if not bool(torch.isfinite(x).all())]
        if bad:
            print(f"non-finite at K={K} V={V} T={T} tuning={tuning}:", ", ".join(bad))
        ok &= not bad
    set_tuning((0, 0))
    print("sanitize run:", "finite" if ok else "NON-FINITE OUTPUTS")
    return ok


def check(results, quick=False):
    ok = True
    thr = {"o": 5e-3, "ht": 5e-3, "grad": 1e-2}
    for dt in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)):
        for K, V in (((64, 128), (128, 128)) if quick else ((64, 64), (64, 128), (128, 64), (128, 128))):
            for T in ((1, 65, 200) if quick else (1, 63, 64, 65, 200)):
                for with_h0 in (False, True):
                    for gate_div in (1, 16):
                        seed = T * 7 + K + V + (1000 if with_h0 else 0) + 100 * gate_div
                        q, k, v, g, beta, h0 = inputs(2, T, 3, K, V, dt, gate_div, seed=T * 7 + K + V)
                        # cotangents from the case's own generator (recorded seed), as the kernels get them
                        cg = torch.Generator(device=DEV).manual_seed(seed)
                        h0 = h0 if with_h0 else None
                        scale = K ** -0.5
                        # simple_gla forward and backward against float64 autograd
                        xs = [x.double().requires_grad_() for x in (q, k, v, g)]
                        h0d = h0.double().requires_grad_() if h0 is not None else None
                        o_r, ht_r = ref_sgla(*xs, scale, h0d)
                        do = cotangent(o_r, cg, dt)
                        dht = cotangent(ht_r, cg, torch.float32) if with_h0 else None
                        loss = (o_r * do).sum() + ((ht_r * dht).sum() if dht is not None else 0)
                        grads = torch.autograd.grad(loss, xs + ([h0d] if h0d is not None else []))
                        fwd = sgla_fwd(q, k, v, g, scale, h0)
                        dg_errs = {}
                        dq, dk, dv, dg, dh0 = sgla_bwd(q, k, v, g, scale, h0, do.to(dt),
                                                       dht.float() if dht is not None else None, fwd, dg_errs)
                        fo, fht = sgla_fused(q, k, v, g, scale, h0)
                        errs = {"o": rel(fwd[0], o_r), "ht": rel(fwd[1], ht_r), "o_fused": rel(fo, o_r),
                                "ht_fused": rel(fht, ht_r), "dq": rel(dq, grads[0]),
                                "dk": rel(dk, grads[1]), "dv": rel(dv, grads[2]), "dg": rel(dg, grads[3])}
                        if h0 is not None:
                            errs["dh0"] = rel(dh0, grads[4])
                        errs["cumsum"] = rel(kcumsum(g, T), chunk_cumsum(g.double(), T))
                        errs.update(dg_errs)
                        # gated delta rule forward
                        qd, kd, vd, gd, betad, _ = inputs(2, T, 3, K, V, dt, gate_div, seed=T * 5 + K, delta=True)
                        o2, ht2 = gdn_fwd(qd, kd, vd, gd, betad.to(dt), scale, h0)
                        o2r, ht2r = ref_gdn(qd.double(), kd.double(), vd.double(), gd.double(),
                                            betad.to(dt).double(), scale, h0.double() if h0 is not None else None)
                        errs["gdn_o"] = rel(o2, o2r)
                        errs["gdn_ht"] = rel(ht2, ht2r)
                        o3, ht3 = gdn_fwd(qd, kd, vd, gd, betad.to(dt), scale, h0, fused=False)
                        errs["gdn_o_split"] = rel(o3, o2r)
                        errs["gdn_ht_split"] = rel(ht3, ht2r)
                        errs.update(gdn_bwd_walk_errors(qd, kd, vd, gd, betad.to(dt), scale,
                                                        cotangent(h0, cg, torch.float32) if with_h0 else None, cg))
                        # gated delta rule backward against float64 autograd
                        xg = [x.double().requires_grad_() for x in (qd, kd, vd, gd, betad.to(dt))]
                        o4, ht4 = ref_gdn(*xg, scale, h0d)
                        do4 = cotangent(o4, cg, dt)
                        dht4 = cotangent(ht4, cg, torch.float32) if with_h0 else None
                        loss = (o4 * do4).sum() + ((ht4 * dht4).sum() if dht4 is not None else 0)
                        gr = torch.autograd.grad(loss, xg + ([h0d] if h0d is not None else []))
                        mine = gdn_bwd(qd, kd, vd, gd, betad.to(dt), scale, h0, do4.to(dt),
                                       dht4.float() if dht4 is not None else None, errs)
                        for n_, a_, b_ in zip(("gdn_dq", "gdn_dk", "gdn_dv", "gdn_dg", "gdn_dbeta", "gdn_dh0"),
                                              mine, gr):
                            errs[n_] = rel(a_, b_)
                        errs["gdn_x"] = rel(gdn_x(kd, vd, gd, betad.to(dt)), ref_x(kd, gd, betad.to(dt)))
                        lim = {n: thr["o"] if n in ("o", "gdn_o", "o_fused", "gdn_o_split", "gdn_x", "cumsum") else thr["ht"] if "ht" in n else thr["grad"]
                               for n in errs}
                        # the decay_grad kernel: fp32 sums against float64; its rounding of dq / dk exact
                        lim.update({n: 0.0 if n.endswith("cast") else 1e-4 for n in errs if "decay_grad" in n})
                        # chunk_dqkv with the row dots: equal outputs; dg within fp32 sums of the other path
                        lim.update({n: 0.0 if n.endswith("same") else 1e-4 for n in errs if "dots_" in n})
                        bad = {n: e for n, e in errs.items() if not e <= lim[n]}
                        ok &= not bad
                        case = dict(dtype=str(dt).split(".")[-1], K=K, V=V, T=T, h0=with_h0, gate_div=gate_div,
                                    cotangent_seed=seed, errors=errs, passed=not bad)
                        results.append(case)
                        if bad:
                            print("FAIL", {k_: v_ for k_, v_ in case.items() if k_ != "errors"}, bad)
    worst = {}
    for c in results:
        for n, e in c["errors"].items():
            worst[n] = max(worst.get(n, 0.0), e)
    print("worst relative RMS errors:", {n: f"{e:.2e}" for n, e in worst.items()})
    return ok


def check_tunings(results):
    """Every launch choice of TUNINGS against the float64 references: simple_gla forward (walk +
    output) and backward (reverse walk), gated delta rule forward through walk + output and its
    reverse walk."""
    ok = True
    for K, V in ((64, 128), (128, 128), (128, 64)):
        for T in (65, 200):
            q, k, v, g, beta, h0 = inputs(2, T, 3, K, V, torch.bfloat16, 4, seed=T * 3 + K + V)
            qd, kd, vd, gd, betad, _ = inputs(2, T, 3, K, V, torch.bfloat16, 4, seed=T * 11 + K, delta=True)
            betad = betad.bfloat16()
            scale = K ** -0.5
            xs = [x.double().requires_grad_() for x in (q, k, v, g)]
            h0d = h0.double()
            o_r, ht_r = ref_sgla(*xs, scale, h0d)
            do = cotangent(o_r, torch.Generator(device=DEV).manual_seed(T * 3 + K + V), torch.bfloat16)
            grads = torch.autograd.grad((o_r * do).sum(), xs)
            o2r, ht2r = ref_gdn(qd.double(), kd.double(), vd.double(), gd.double(), betad.double(), scale, h0d)
            for t in TUNINGS:
                set_tuning(t)
                fwd = sgla_fwd(q, k, v, g, scale, h0)
                dq, dk, dv, dg, _ = sgla_bwd(q, k, v, g, scale, h0, do.bfloat16(), None, fwd)
                o3, ht3 = gdn_fwd(qd, kd, vd, gd, betad, scale, h0, fused=False)
                errs = {"o": rel(fwd[0], o_r), "ht": rel(fwd[1], ht_r), "dq": rel(dq, grads[0]),
                        "dk": rel(dk, grads[1]), "dv": rel(dv, grads[2]), "dg": rel(dg, grads[3]),
                        "gdn_o_split": rel(o3, o2r), "gdn_ht_split": rel(ht3, ht2r)}
                errs.update(gdn_bwd_walk_errors(qd, kd, vd, gd, betad, scale, h0,
                                                torch.Generator(device=DEV).manual_seed(T * 7 + K + V)))
                lim = {n: 5e-3 if n in ("o", "ht", "gdn_o_split", "gdn_ht_split") else 1e-2 for n in errs}
                bad = {n: e for n, e in errs.items() if not e <= lim[n]}
                ok &= not bad
                results.append(dict(tuning=t, K=K, V=V, T=T, errors=errs, passed=not bad))
                if bad:
                    print("FAIL tuning", t, K, V, T, bad)
    set_tuning((0, 0))
    print("tuning checks", "passed" if ok else "FAILED", f"({len(TUNINGS)} launch choices)")
    return ok


def time_it(fn, sets, reps=20, warmup=3):
    for i in range(warmup):
        fn(sets[i % 2])
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(sets[i % 2])
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


FLA_REFUSES_BWD = None


def lift_fla_hopper_guard():
    """flash-linear-attention 0.6.0 refuses its gated backward (chunk_bwd_dqkwg) on Hopper with Triton
    < 3.7.1, whose compiler it reports to produce wrong results there. Lift that refusal so the
    backward can be timed and its gradients compared with ours; returns whether it refused here."""
    global FLA_REFUSES_BWD
    import fla.ops.common.chunk_o as chunk_o
    if FLA_REFUSES_BWD is None:
        FLA_REFUSES_BWD = bool(getattr(chunk_o, "IS_NVIDIA_HOPPER", False)
                               and getattr(chunk_o, "TRITON_ABOVE_3_4_0", False)
                               and not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True))
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return FLA_REFUSES_BWD


def fla_fwd_bwd(row, sets, sc, chunk_simple_gla, chunk_gated_delta_rule):
    """flash-linear-attention forward + backward (torch.autograd.grad of sum(o * do)) timed next to ours
    (our forward, then our backward with its recomputation), and the relative difference of every
    gradient between the two on the first input set."""
    row["fla_bwd_refusal_lifted"] = lift_fla_hopper_guard()

    def leaves(a, names):
        return [a[n].detach().requires_grad_() for n in names]

    def fla_sgla(a):
        xs = leaves(a, ("q", "k", "v", "g"))
        o, _ = chunk_simple_gla(*xs)
        return torch.autograd.grad(o, xs, a["do"])

    def fla_gdn(a):
        xs = leaves(a, ("qn", "kn", "v", "g", "beta"))
        o, _ = chunk_gated_delta_rule(*xs)
        return torch.autograd.grad(o, xs, a["do"])

    row["fla_sgla_fwdbwd_ms"] = time_it(fla_sgla, sets)
    row["fla_gdn_fwdbwd_ms"] = time_it(fla_gdn, sets)
    # our forward as the op runs it: fused when B*H >= 3 * SMs (prefer_fused), else walk + output
    B, _, H, _ = sets[0]["q"].shape
    fused = B * H >= 3 * torch.cuda.get_device_properties(0).multi_processor_count
    sgla_f = sgla_fused if fused else (lambda *x: sgla_fwd(*x)[:2])
    row["ours_sgla_fwd_then_bwd_ms"] = time_it(
        lambda a: (sgla_f(a["q"], a["k"], a["v"], a["g"], sc, None),
                   sgla_bwd(a["q"], a["k"], a["v"], a["g"], sc, None, a["do"], None)), sets)
    row["ours_gdn_fwd_then_bwd_ms"] = time_it(
        lambda a: (gdn_fwd(a["qn"], a["kn"], a["v"], a["g"], a["beta"], sc, None, fused),
                   gdn_bwd(a["qn"], a["kn"], a["v"], a["g"], a["beta"], sc, None, a["do"], None)), sets)
    a = sets[0]
    ours = sgla_bwd(a["q"], a["k"], a["v"], a["g"], sc, None, a["do"], None)
    row["sgla_grad_rel_diff_vs_fla"] = {n: rel(x, y) for n, x, y in zip(("dq", "dk", "dv", "dg"), ours, fla_sgla(a))}
    ours = gdn_bwd(a["qn"], a["kn"], a["v"], a["g"], a["beta"], sc, None, a["do"], None)
    row["gdn_grad_rel_diff_vs_fla"] = {n: rel(x, y) for n, x, y in
                                       zip(("dq", "dk", "dv", "dg", "dbeta"), ours, fla_gdn(a))}


def backward_parts(row, a, T, sc):
    """Each kernel of the two backwards timed alone on the first input set (its inputs made once):
    simple_gla's reverse walk, chunk_dqkv and decay_grad; the gated delta rule's delta_prep with X,
    forward walk, dv_local, reverse walk, chunk_dqkv (v_new as values), WY backward, decay_grad."""
    one = [a, a]
    q, k, v, do, qn, kn = a["q"], a["k"], a["v"], a["do"], a["qn"], a["kn"]
    B, _, H, K = q.shape
    V, NT = v.shape[-1], (T + 63) // 64
    f32 = dict(dtype=torch.float32, device=DEV)
    dqf, dkf = torch.empty(B, T, H, K, **f32), torch.empty(B, T, H, K, **f32)
    y, z, x2 = torch.empty(B, T, H, **f32), torch.empty(B, NT, H, **f32), torch.empty(B, T, H, **f32)
    dgo, dq, dk, dv = torch.empty(B, T, H, **f32), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    xdot = torch.empty(B, T, H, **f32)
    # simple_gla
    _, _, hs, b = sgla_fwd(q, k, v, a["g"], sc, None)
    dhs, dh0 = torch.empty_like(hs), torch.empty(B, H, K, V, **f32)
    parts = {"sgla_walk_bwd": lambda _: call("ck_walk_bwd", 0, p(q), p(do), p(b), p(None), p(dhs), p(dh0),
                                             ctypes.c_float(sc), B, T, H, K, V, stream()),
             "sgla_dqkv": lambda _: call("ck_dqkv", 0, p(q), p(k), p(v), p(do), p(b), p(hs), p(dhs), p(dqf), p(dkf),
                                         p(dv), p(y), p(z), ctypes.c_float(sc), B, T, H, K, V, stream()),
             "sgla_decay_grad": lambda _: call("ck_decay_grad", 0, p(q), p(dqf), p(k), p(dkf), p(y), p(z), p(None),
                                               p(None), p(dgo), p(dq), p(dk), B, T, H, K, stream()),
             # chunk_dqkv forming the row dots, then decay_grad from them
             "sgla_dqkv_dots": lambda _: call("ck_dqkv_dots", 0, p(q), p(k), p(v), p(do), p(b), p(hs), p(dhs), p(None),
                                              p(dq), p(dk), p(dv), p(y), p(z), p(xdot), ctypes.c_float(sc),
                                              B, T, H, K, V, stream()),
             "sgla_decay_grad_dots": lambda _: call("ck_decay_grad", 0, p(q), p(None), p(k), p(None), p(y), p(z),
                                                    p(None), p(xdot), p(dgo), p(None), p(None), B, T, H, K, stream())}
    row["bwd_part_ms"] = {n: time_it(f, one) for n, f in parts.items()}
    # gated delta rule
    _, w, u, X = gdn_prep(kn, v, a["g"], a["beta"], with_x=True)
    betaf = a["beta"].float().contiguous()
    hs2, vn, ht = torch.empty_like(hs), torch.empty_like(v), torch.empty(B, H, K, V, **f32)
    call("ck_walk_fwd", 0, p(kn), p(u), p(w), p(b), p(None), p(hs2), p(vn), p(ht), B, T, H, K, V, stream())
    dvl, du = torch.empty_like(v), torch.empty_like(v)
    call("ck_dv_local", 0, p(qn), p(kn), p(do), p(b), p(dvl), ctypes.c_float(sc), B, T, H, K, V, stream())
    wx, ux, X2 = torch.empty_like(w), torch.empty_like(u), torch.empty_like(X)
    dbeta = torch.empty(B, T, H, **f32)
    parts = {"gdn_prep_with_x": lambda _: call("ck_prep", 0, p(kn), p(v), p(betaf), p(b), p(wx), p(ux), p(X2),
                                               B, T, H, K, V, stream()),
             "gdn_walk_fwd": lambda _: call("ck_walk_fwd", 0, p(kn), p(u), p(w), p(b), p(None), p(hs2), p(vn), p(ht),
                                            B, T, H, K, V, stream()),
             "gdn_dv_local": lambda _: call("ck_dv_local", 0, p(qn), p(kn), p(do), p(b), p(dvl), ctypes.c_float(sc),
                                            B, T, H, K, V, stream()),
             "gdn_walk_bwd": lambda _: call("ck_walk_bwd_delta", 0, p(qn), p(do), p(kn), p(w), p(dvl), p(b), p(None),
                                            p(dhs), p(du), p(dh0), ctypes.c_float(sc), B, T, H, K, V, stream()),
             "gdn_dqkv": lambda _: call("ck_dqkv", 0, p(qn), p(kn), p(vn), p(do), p(b), p(hs2), p(dhs), p(dqf),
                                        p(dkf), p(dv), p(y), p(z), ctypes.c_float(sc), B, T, H, K, V, stream()),
             "gdn_wy_bwd": lambda _: call("ck_wy_bwd", 0, p(kn), p(v), p(du), p(hs2), p(X), p(betaf), p(b), p(dkf),
                                          p(dk), p(dv), p(dbeta), p(x2), B, T, H, K, V, stream()),
             "gdn_decay_grad": lambda _: call("ck_decay_grad", 0, p(qn), p(dqf), p(kn), p(dkf), p(y), p(z), p(x2),
                                              p(None), p(dgo), p(dq), p(None), B, T, H, K, stream()),
             "gdn_dqkv_dots": lambda _: call("ck_dqkv_dots", 0, p(qn), p(kn), p(vn), p(do), p(b), p(hs2), p(dhs),
                                             p(dkf), p(dq), p(None), p(None), p(y), p(z), p(xdot), ctypes.c_float(sc),
                                             B, T, H, K, V, stream()),
             "gdn_decay_grad_dots": lambda _: call("ck_decay_grad", 0, p(qn), p(None), p(kn), p(None), p(y), p(z),
                                                   p(x2), p(xdot), p(dgo), p(None), p(None), B, T, H, K, stream())}
    row["bwd_part_ms"].update({n: time_it(f, one) for n, f in parts.items()})
    print(json.dumps({"T": T, "bwd_part_ms": row["bwd_part_ms"]}))


def timing(out, lengths, sweep=False, fla_bwd=False, bwd_parts=False):
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # noqa: BLE001
        chunk_simple_gla = chunk_gated_delta_rule = None
        print("flash-linear-attention not importable:", e)
    H, D = 16, 128
    for T in lengths:
        B = 65536 // T
        sets = []
        for s in range(2):
            q, k, v, g, beta, _ = inputs(B, T, H, D, D, torch.bfloat16, 16, seed=100 + s)
            qn, kn = F.normalize(q.float(), dim=-1).bfloat16(), F.normalize(k.float(), dim=-1).bfloat16()
            do = torch.randn_like(v)
            sets.append(dict(q=q, k=k, v=v, g=g, beta=beta.bfloat16(), qn=qn, kn=kn, do=do))
        sc = D ** -0.5
        row = dict(B=B, T=T, H=H, D=D)
        a0 = sets[0]
        NT = T // 64
        b0 = chunk_cumsum(a0["g"], T)
        hs0 = torch.empty(B, H, NT, D, D, dtype=torch.bfloat16, device=DEV)
        ht0 = torch.empty(B, H, D, D, device=DEV)
        o0 = torch.empty_like(a0["v"])
        one = [a0, a0]
        row["part_cumsum_ms"] = time_it(lambda a: kcumsum(a["g"], T), one)
        row["part_walk_ms"] = time_it(lambda a: call("ck_walk_fwd", 0, p(a["k"]), p(a["v"]), p(None), p(b0), p(None),
                                                     p(hs0), p(None), p(ht0), B, T, H, D, D, stream()), one)
        row["part_output_ms"] = time_it(lambda a: call("ck_output", 0, p(a["q"]), p(a["k"]), p(a["v"]), p(b0), p(hs0),
                                                       p(o0), ctypes.c_float(sc), B, T, H, D, D, stream()), one)
        betaf = a0["beta"].float()
        row["part_prep_ms"] = time_it(lambda a: call("ck_prep", 0, p(a["kn"]), p(a["v"]), p(betaf), p(b0), p(hs0),
                                                     p(o0), p(None), B, T, H, D, D, stream()), one)
        if sweep:
            # every launch choice: the walks (simple_gla, delta rule) and the output kernel
            sw = {}
            u0 = torch.empty_like(a0["v"])
            for t in TUNINGS:
                set_tuning(t)
                bv, sp = t
                if sp == 1:
                    sw[f"walk_bv{bv}"] = time_it(lambda a: call(
                        "ck_walk_fwd", 0, p(a["k"]), p(a["v"]), p(None), p(b0), p(None), p(hs0), p(None), p(ht0),
                        B, T, H, D, D, stream()), one)
                    sw[f"walk_delta_bv{bv}"] = time_it(lambda a: call(
                        "ck_walk_fwd", 0, p(a["kn"]), p(a["v"]), p(a["kn"]), p(b0), p(None), p(hs0), p(u0), p(ht0),
                        B, T, H, D, D, stream()), one)
                    sw[f"walk_bwd_bv{bv}"] = time_it(lambda a: call(
                        "ck_walk_bwd", 0, p(a["q"]), p(a["do"]), p(b0), p(None), p(hs0), p(ht0), ctypes.c_float(sc),
                        B, T, H, D, D, stream()), one)
                if bv == 32:
                    sw[f"output_split{sp}"] = time_it(lambda a: call(
                        "ck_output", 0, p(a["q"]), p(a["k"]), p(a["v"]), p(b0), p(hs0), p(o0), ctypes.c_float(sc),
                        B, T, H, D, D, stream()), one)
            set_tuning((0, 0))
            row["sweep_ms"] = sw
            print(json.dumps(sw))
        if bwd_parts:
            backward_parts(row, a0, T, sc)
        row["note"] = ("ours_*_ms: fused kernel; *_split_ms: walk + output kernels; ours_sgla_fwdbwd_ms and "
                       "ours_gdn_bwd_ms: the backward with its forward recomputation")
        row["ours_sgla_fwd_split_ms"] = time_it(lambda a: sgla_fwd(a["q"], a["k"], a["v"], a["g"], sc, None), sets)
        row["ours_sgla_fwd_ms"] = time_it(lambda a: sgla_fused(a["q"], a["k"], a["v"], a["g"], sc, None), sets)
        row["ours_sgla_fwdbwd_ms"] = time_it(
            lambda a: sgla_bwd(a["q"], a["k"], a["v"], a["g"], sc, None, a["do"], None), sets)
        row["ours_gdn_fwd_ms"] = time_it(
            lambda a: gdn_fwd(a["qn"], a["kn"], a["v"], a["g"], a["beta"], sc, None), sets)
        row["ours_gdn_fwd_split_ms"] = time_it(
            lambda a: gdn_fwd(a["qn"], a["kn"], a["v"], a["g"], a["beta"], sc, None, fused=False), sets)
        row["ours_gdn_bwd_ms"] = time_it(
            lambda a: gdn_bwd(a["qn"], a["kn"], a["v"], a["g"], a["beta"], sc, None, a["do"], None), sets)
        if chunk_simple_gla is not None:
            row["fla_sgla_fwd_ms"] = time_it(lambda a: chunk_simple_gla(a["q"], a["k"], a["v"], a["g"]), sets)
            row["fla_gdn_fwd_ms"] = time_it(
                lambda a: chunk_gated_delta_rule(a["qn"], a["kn"], a["v"], a["g"], a["beta"]), sets)
            o_f, _ = chunk_simple_gla(sets[0]["q"], sets[0]["k"], sets[0]["v"], sets[0]["g"])
            o_o = sgla_fwd(sets[0]["q"], sets[0]["k"], sets[0]["v"], sets[0]["g"], sc, None)[0]
            row["sgla_rel_diff_vs_fla"] = rel(o_o, o_f)
            o_f, _ = chunk_gated_delta_rule(sets[0]["qn"], sets[0]["kn"], sets[0]["v"], sets[0]["g"], sets[0]["beta"])
            o_o = gdn_fwd(sets[0]["qn"], sets[0]["kn"], sets[0]["v"], sets[0]["g"], sets[0]["beta"], sc, None)[0]
            row["gdn_rel_diff_vs_fla"] = rel(o_o, o_f)
            if fla_bwd:
                fla_fwd_bwd(row, sets, sc, chunk_simple_gla, chunk_gated_delta_rule)
        print(json.dumps(row))
        out.append(row)


def main():
    global L
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--lib", default="/tmp/libmixbench_chunk.so")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--quick", action="store_true", help="bf16 and fewer shapes")
    ap.add_argument("--sanitize", action="store_true", help="run every kernel once on small shapes, no references")
    ap.add_argument("--lengths", default="2048,8192,32768")
    ap.add_argument("--sweep", action="store_true", help="also time every launch choice of the walks and the output")
    ap.add_argument("--fla-bwd", action="store_true",
                    help="also time flash-linear-attention's forward + backward, lifting its refusal on Hopper with "
                         "Triton < 3.7.1 (the row says so), and compare its gradients with ours")
    ap.add_argument("--bwd-parts", action="store_true", help="also time each kernel of the two backwards alone")
    ap.add_argument("--build-only", action="store_true", help="build the library into --lib and stop")
    a = ap.parse_args()
    if a.build_only:
        build(a.lib)
        return
    L = ctypes.CDLL(a.lib) if os.environ.get("PREBUILT") and os.path.exists(a.lib) else build(a.lib)
    if L.ck_layout_ok() != 1:
        print("accumulator fragment layout differs from the one the kernels assume")
        sys.exit(1)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": [], "timing": []}
    for mod, key in (("fla", "fla"), ("triton", "triton")):  # the peer's versions, where importable
        try:
            res[key] = getattr(__import__(mod), "__version__", "?")
        except Exception:  # noqa: BLE001 — absent peer: no version
            res[key] = None
    global POISON
    if a.sanitize:
        sys.exit(0 if sanitize_run() else 1)
    ok = True if a.no_check else check(res["checks"], a.quick)
    if not a.no_check:
        res["tuning_checks"] = []
        ok &= check_tunings(res["tuning_checks"])
    POISON = False
    print("checks", "passed" if ok else "FAILED")
    if not a.no_time:
        timing(res["timing"], [int(x) for x in a.lengths.split(",")], a.sweep, a.fla_bwd, a.bwd_parts)
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1)
        os.replace(tmp, a.out)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
