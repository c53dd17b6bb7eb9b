#!/usr/bin/env python3
"""Make golden files with flash-linear-attention's naive references, in float64.

    pip install fla-core==0.6.0 safetensors packaging
    python3 tests/goldens/make_fla_goldens.py tests/goldens

Each file holds an op's inputs, outputs, cotangents d<out> and gradients grad_<in> of
sum(o·do) [+ sum(ht·dht)], with `op` and its scalar parameters in the metadata.
dsa_indexer files hold q_idx, k_idx, w_idx and expected_indices ([B,T,topk], −1 padded), which
are compared as sets per query.
"""
import contextlib
import os
import sys

import torch
from safetensors.torch import save_file


def grads(inputs, outputs, cot):
    loss = sum((o * c).sum() for o, c in zip(outputs, cot))
    return torch.autograd.grad(loss, inputs)


def attention_golden(path, B, T, HQ, H, D, window, seed):
    from fla.ops.attn.naive import naive_parallel_attn
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, n, D, generator=g, dtype=torch.float64, requires_grad=True) for n in (HQ, H, H))
    scale = D ** -0.5
    o, _ = naive_parallel_attn(q, k, v, scale=scale, window_size=window if window > 0 else None, causal=True)
    do = torch.randn(o.shape, generator=g, dtype=torch.float64)
    gq, gk, gv = grads([q, k, v], [o], [do])
    tensors = dict(q=q, k=k, v=v, o=o, do=do, grad_q=gq, grad_k=gk, grad_v=gv)
    meta = dict(op="attention", scale=repr(scale), window=str(window), source="fla.ops.attn.naive.naive_parallel_attn")
    save_file({n: t.detach().contiguous() for n, t in tensors.items()}, path, metadata=meta)


@contextlib.contextmanager
def keep_float64():
    """FLA's naive DSA functions upcast with `.float()` (to float32). While this is active
    `.float()` leaves float64 tensors as they are, so the same code computes in float64."""
    orig = torch.Tensor.float
    orig_to = torch.Tensor.to
    orig_new_zeros = torch.Tensor.new_zeros

    def to(self, *a, **kw):
        # x.to(torch.float) / x.to(dtype=torch.float32) keep float64 tensors as they are
        wants_f32 = (a and a[0] is torch.float32) or kw.get("dtype") is torch.float32
        return self if (self.dtype == torch.float64 and wants_f32) else orig_to(self, *a, **kw)

    def new_zeros(self, *a, **kw):
        if self.dtype == torch.float64 and kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return orig_new_zeros(self, *a, **kw)

    torch.Tensor.float = lambda self, *a, **kw: self if self.dtype == torch.float64 else orig(self, *a, **kw)
    torch.Tensor.to = to
    torch.Tensor.new_zeros = new_zeros
    try:
        yield
    finally:
        torch.Tensor.float = orig
        torch.Tensor.to = orig_to
        torch.Tensor.new_zeros = orig_new_zeros


def indexer_scores(q_idx, k_idx, w_idx, scale):
    """I[b,t,s] = sum_j w[t,j] relu(scale q_idx[t,j].k_idx[s]) in float64, -inf for s > t."""
    sim = torch.relu(torch.einsum("bthd,bsd->bths", q_idx, k_idx) * scale)
    score = torch.einsum("bths,bth->bts", sim, w_idx)
    T = q_idx.shape[1]
    future = torch.arange(T)[None, :] > torch.arange(T)[:, None]
    return score.masked_fill(future, float("-inf"))


def clear_margin(score, topk, rel=1e-4):
    """True when every query's top-k boundary is separated by more than rel·max|I| (no ties or
    near-ties that float32 rounding or torch.topk's unspecified tie order could flip)."""
    B, T, _ = score.shape
    for b in range(B):
        for t in range(T):
            vis = torch.sort(score[b, t, : t + 1], descending=True).values
            if topk < t + 1 and (vis[topk - 1] - vis[topk]) <= rel * vis.abs().max():
                return False
    return True


def indexer_inputs(B, T, HI, DI, topk, seed):
    """Index queries/keys/weights whose selections have a clear top-k margin (seed advanced until so)."""
    while True:
        g = torch.Generator().manual_seed(seed)
        q_idx = torch.randn(B, T, HI, DI, generator=g, dtype=torch.float64)
        k_idx = torch.randn(B, T, DI, generator=g, dtype=torch.float64)
        w_idx = torch.randn(B, T, HI, generator=g, dtype=torch.float64)
        if clear_margin(indexer_scores(q_idx, k_idx, w_idx, DI ** -0.5), topk):
            return q_idx, k_idx, w_idx
        seed += 1000


def dsa_indexer_golden(path, B, T, HI, DI, topk, seed):
    from fla.ops.dsa.naive import naive_dsa_indexer
    q_idx, k_idx, w_idx = indexer_inputs(B, T, HI, DI, topk, seed)
    with keep_float64():
        idx = naive_dsa_indexer(q_idx, k_idx, w_idx, topk=topk, activation="relu")
    tensors = dict(q_idx=q_idx, k_idx=k_idx, w_idx=w_idx, expected_indices=idx)
    meta = dict(op="dsa_indexer", topk=str(topk), activation="relu", scale=repr(DI ** -0.5),
                source="fla.ops.dsa.naive.naive_dsa_indexer")
    save_file({n: t.contiguous() for n, t in tensors.items()}, path, metadata=meta)


def dsa_golden(path, B, T, HQ, H, D, topk, seed):
    """naive_dsa with the indices its own indexer selects (passed explicitly, so the op's input)."""
    from fla.ops.dsa.naive import naive_dsa, naive_dsa_indexer
    q_idx, k_idx, w_idx = indexer_inputs(B, T, 4, 8, topk, seed + 500)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, n, D, generator=g, dtype=torch.float64, requires_grad=True) for n in (HQ, H, H))
    scale = D ** -0.5
    with keep_float64():
        indices = naive_dsa_indexer(q_idx, k_idx, w_idx, topk=topk, activation="relu")
        o = naive_dsa(q, k, v, None, None, indices=indices, topk=topk, scale=scale)
    assert o.dtype == torch.float64
    do = torch.randn(o.shape, generator=g, dtype=torch.float64)
    gq, gk, gv = grads([q, k, v], [o], [do])
    tensors = dict(q=q, k=k, v=v, indices=indices, o=o, do=do, grad_q=gq, grad_k=gk, grad_v=gv)
    meta = dict(op="sparse_attention", scale=repr(scale), topk=str(topk), source="fla.ops.dsa.naive.naive_dsa")
    save_file({n: t.detach().contiguous() for n, t in tensors.items()}, path, metadata=meta)


def linear_golden(path, op, B, T, H, K, V, seed, with_h0=True):
    """simple_gla, gla, delta_rule, gated_delta_rule, kda through FLA's naive recurrences."""
    import torch.nn.functional as F
    g_ = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g_, dtype=torch.float64)
    q = torch.randn(B, T, H, K, **f64)
    k = torch.randn(B, T, H, K, **f64)
    if op in ("delta_rule", "gated_delta_rule", "kda"):  # the delta rules expect L2-normalised keys
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, **f64)
    ins = dict(q=q, k=k, v=v)
    if op in ("simple_gla", "gated_delta_rule"):
        ins["g"] = F.logsigmoid(torch.randn(B, T, H, **f64)) / 4
    if op in ("gla", "kda"):
        ins["g"] = F.logsigmoid(torch.randn(B, T, H, K, **f64)) / 4
    if op in ("delta_rule", "gated_delta_rule", "kda"):
        ins["beta"] = torch.sigmoid(torch.randn(B, T, H, **f64))
    if with_h0:
        ins["h0"] = torch.randn(B, H, K, V, **f64)
    for t in ins.values():
        t.requires_grad_(True)
    scale = K ** -0.5
    h0 = ins.get("h0")
    with keep_float64():
        if op == "simple_gla":
            from fla.ops.simple_gla.naive import naive_recurrent_simple_gla
            o, ht = naive_recurrent_simple_gla(q, k, v, ins["g"], scale=scale, initial_state=h0, output_final_state=True)
        elif op == "gla":
            from fla.ops.gla.naive import naive_recurrent_gla
            o, ht = naive_recurrent_gla(q, k, v, ins["g"], initial_state=h0, output_final_state=True)
        elif op == "delta_rule":  # head-first layout [B,H,T,D]
            from fla.ops.delta_rule.naive import delta_rule_recurrence
            o, ht = delta_rule_recurrence(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          ins["beta"].transpose(1, 2), initial_state=h0, output_final_state=True)
            o = o.transpose(1, 2)
        elif op == "gated_delta_rule":
            from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
            o, ht = naive_recurrent_gated_delta_rule(q, k, v, ins["beta"], ins["g"], scale=scale, initial_state=h0,
                                                     output_final_state=True)
        else:
            from fla.ops.kda.naive import naive_recurrent_kda
            o, ht = naive_recurrent_kda(q, k, v, ins["g"], ins["beta"], scale=scale, initial_state=h0,
                                        output_final_state=True)
    assert o.dtype == torch.float64 and ht.dtype == torch.float64, (op, o.dtype, ht.dtype)
    do = torch.randn(o.shape, **f64)
    dht = torch.randn(ht.shape, **f64)
    names = list(ins)
    gs = grads([ins[n] for n in names], [o, ht], [do, dht])
    tensors = dict(ins, o=o, ht=ht, do=do, dht=dht, **{f"grad_{n}": g for n, g in zip(names, gs)})
    meta = dict(op=op, scale=repr(scale), source=f"fla.ops.{op}.naive (float64)")
    save_file({n: t.detach().contiguous() for n, t in tensors.items()}, path, metadata=meta)


def main(out):
    os.makedirs(out, exist_ok=True)
    attention_golden(f"{out}/fla_attention_causal.safetensors", 2, 45, 4, 4, 16, 0, 1)
    attention_golden(f"{out}/fla_attention_window.safetensors", 2, 70, 4, 4, 16, 9, 2)
    attention_golden(f"{out}/fla_attention_gqa_window.safetensors", 1, 53, 6, 2, 8, 16, 3)
    attention_golden(f"{out}/fla_attention_gqa.safetensors", 2, 31, 4, 1, 8, 0, 4)
    dsa_golden(f"{out}/fla_dsa_sparse_attention.safetensors", 2, 37, 4, 4, 16, 8, 5)
    dsa_golden(f"{out}/fla_dsa_sparse_attention_gqa.safetensors", 1, 45, 6, 2, 8, 12, 6)
    dsa_indexer_golden(f"{out}/fla_dsa_indexer.safetensors", 2, 41, 4, 16, 7, 7)
    dsa_indexer_golden(f"{out}/fla_dsa_indexer_topk_gt_T.safetensors", 1, 19, 8, 8, 32, 8)
    for i, op in enumerate(("simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda")):
        linear_golden(f"{out}/fla_{op}.safetensors", op, 2, 70, 2, 16, 12, 20 + i)
        linear_golden(f"{out}/fla_{op}_noh0_T1.safetensors", op, 1, 1, 2, 8, 8, 40 + i, with_h0=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
