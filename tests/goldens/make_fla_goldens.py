#!/usr/bin/env python3
"""Make golden files with flash-linear-attention's naive references, in float64.

    pip install fla-core==0.6.0 safetensors packaging
    python3 tests/goldens/make_fla_goldens.py tests/goldens

Each file holds an op's inputs, outputs, cotangents d<out> and gradients grad_<in> of
sum(o·do) [+ sum(ht·dht)], with `op` and its scalar parameters in the metadata.
"""
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


def main(out):
    os.makedirs(out, exist_ok=True)
    attention_golden(f"{out}/fla_attention_causal.safetensors", 2, 45, 4, 4, 16, 0, 1)
    attention_golden(f"{out}/fla_attention_window.safetensors", 2, 70, 4, 4, 16, 9, 2)
    attention_golden(f"{out}/fla_attention_gqa_window.safetensors", 1, 53, 6, 2, 8, 16, 3)
    attention_golden(f"{out}/fla_attention_gqa.safetensors", 2, 31, 4, 1, 8, 0, 4)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
