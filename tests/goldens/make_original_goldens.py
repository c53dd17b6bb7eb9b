#!/usr/bin/env python3
"""Goldens from the ORIGINAL implementations, imported at run time (nothing of them is copied here):
nanochat's GPT (karpathy/nanochat 92d63d4 nanochat/gpt.py) as model-level goldens of `dense` (SSSL)
and `gqa` (one KV head per two query heads, all layers full),
and flash-linear-attention's layers (fla 0.6.0: GatedDeltaNet, DeltaNet) as layer-level goldens of
`gdn` and `deltanet`, all in float64 on the CPU. Also a small nanochat checkpoint (converted by
ci/nanochat_to_safetensors.py) with fixed tokens and the original's loss on them, for
`mixbench eval --checkpoint`.

    git -C NANOCHAT checkout 92d63d4e8bb4df75c3b71618f31ddde2378b2bcd   # or: git archive ... nanochat | tar -x
    pip install fla-core==0.6.0 flash-linear-attention==0.6.0 transformers einops safetensors
    python3 tests/goldens/make_original_goldens.py --nanochat NANOCHAT tests/goldens/original

Where the original cannot run on a CPU in float64 the script substitutes, and says so in each
file's metadata ("substitutions"):
  nanochat  - COMPUTE_DTYPE float64 (nanochat: bf16 on GPUs, fp32 on CPUs)
            - norm(): F.rms_norm with eps = float32's epsilon, the eps nanochat's eps=None gives
              at its compute dtypes (bf16/fp32 compute their statistics in fp32); at float64 eps=None
              would be float64's epsilon
            - the rotary cos/sin buffers recomputed by the same formula in float64 (nanochat computes
              the angles in fp32 and rounds the tables to the compute dtype)
            - logits.float() leaves float64 logits in float64 (nanochat upcasts bf16 logits to fp32)
            - attention: nanochat's own SDPA fallback (flash_attention.py, no FA3 on a CPU): unchanged
  fla       - the Triton kernels (chunk_gated_delta_rule, chunk_delta_rule) replaced by fla's naive
              recurrent references (fla.ops.*.naive), with the pre-processing the kernel flags ask
              for (use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel) written
              out as fla's own torch helpers compute it
            - ShortConvolution's Triton/CUDA causal_conv1d replaced by a plain depthwise
              torch conv1d with the same left padding and activation
            - FusedRMSNormGated / RMSNorm's Triton kernels replaced by their torch formula
              (x·rsqrt(mean x² + eps)·weight [· act(g)])
"""
import argparse
import contextlib
import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore")
F64 = torch.float64
NANOCHAT_COMMIT = "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd"
F32_EPS = float(torch.finfo(torch.float32).eps)


def save(path, tensors, meta):
    from safetensors.torch import save_file
    save_file({n: t.detach().contiguous() for n, t in tensors.items()}, path,
              metadata={k: str(v) for k, v in meta.items()})
    print("wrote", path, len(tensors), "tensors")


@contextlib.contextmanager
def keep_float64():
    """`.float()` leaves float64 tensors in float64 while active."""
    orig = torch.Tensor.float
    torch.Tensor.float = lambda self, *a, **kw: self if self.dtype == F64 else orig(self, *a, **kw)
    try:
        yield
    finally:
        torch.Tensor.float = orig


def randomize(model, gen):
    """Non-zero random values of a sensible scale for every parameter (nanochat's init zeroes the
    output projections and the smear gain, which would leave paths untested)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2 and "wte" not in n and "value_embeds" not in n:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) / math.sqrt(p.shape[1]))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=F64))
            else:
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=gen, dtype=F64))


# ---------------------------------------------------------------- nanochat
def load_nanochat(path):
    sys.path.insert(0, os.path.abspath(path))
    import nanochat.gpt as gpt
    src = open(gpt.__file__).read()
    if "def has_ve(layer_idx, n_layer)" not in src or "backout_lambda" not in src:
        raise SystemExit(f"{gpt.__file__} does not look like nanochat {NANOCHAT_COMMIT[:7]}'s gpt.py")
    return gpt


def nanochat_model(gpt, cfg, float64=True):
    if float64:
        gpt.COMPUTE_DTYPE = F64
        gpt.norm = lambda x: F.rms_norm(x, (x.size(-1),), eps=F32_EPS)
    model = gpt.GPT(gpt.GPTConfig(**cfg))
    model.init_weights()
    if float64:
        model = model.to(F64)
        hd = cfg["n_embd"] // cfg["n_head"]
        inv = 1.0 / (100000 ** (torch.arange(0, hd, 2, dtype=F64) / hd))
        fr = torch.outer(torch.arange(model.rotary_seq_len, dtype=F64), inv)
        model.cos, model.sin = fr.cos()[None, :, None, :], fr.sin()[None, :, None, :]
    return model


NANOCHAT_SUBST = ("COMPUTE_DTYPE float64; norm() = F.rms_norm(eps=float32 eps); rotary tables recomputed in "
                  "float64 by the same formula; logits.float() keeps float64; attention = nanochat's SDPA fallback")


def mixbench_config(cfg):
    return dict(n_layer=cfg["n_layer"], d_model=cfg["n_embd"], head_dim=cfg["n_embd"] // cfg["n_head"],
                seq_len=cfg["sequence_len"], vocab=cfg["vocab_size"], mlp_hidden=0,
                window_pattern=cfg["window_pattern"], short_window=0,
                kv_ratio=cfg["n_head"] // cfg["n_kv_head"])


def nanochat_golden(gpt, out, cfg, B, T, seed, method="dense", name="nanochat_dense"):
    torch.manual_seed(seed)
    model = nanochat_model(gpt, cfg)
    # the deterministic part of nanochat's init_weights(), for the record (tests compare mixbench's init)
    init = {f"nanochat_init.{n}": ",".join(repr(float(v)) for v in p.detach().reshape(-1))
            for n, p in model.named_parameters() if n in ("resid_lambdas", "x0_lambdas", "backout_lambda", "smear_lambda")}
    init["nanochat_init.zero"] = ",".join(n for n, p in model.named_parameters() if p.abs().max().item() == 0)
    g = torch.Generator().manual_seed(seed)
    randomize(model, g)
    V = cfg["vocab_size"]
    idx = torch.randint(V, (B, T), generator=g)
    with keep_float64():
        logits = model(idx)
    assert logits.dtype == F64 and logits.shape == (B, T, V)
    dl = torch.randn(logits.shape, generator=g, dtype=F64)
    (logits * dl).sum().backward()
    tensors = {"idx": idx, "logits": logits, "dlogits": dl}
    for n, p in model.named_parameters():
        tensors[n] = p
        tensors["grad_" + n] = p.grad
    meta = dict(mixbench_config(cfg), method=method, level="model", names="nanochat", seed=seed,
                source=f"karpathy/nanochat {NANOCHAT_COMMIT} nanochat/gpt.py GPT.forward",
                substitutions=NANOCHAT_SUBST, **init)
    save(os.path.join(out, name + ".safetensors"), tensors, meta)


def nanochat_checkpoint(gpt, gpt_path, out, cfg, B, T, seed):
    """A nanochat .pt state dict (fp32, with torch.compile's prefixes) converted by
    ci/nanochat_to_safetensors.py, fixed tokens, and the original's loss on them."""
    import tempfile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "ci"))
    from nanochat_to_safetensors import convert
    g = torch.Generator().manual_seed(seed)
    model = nanochat_model(gpt, cfg)
    randomize(model, g)
    sd = {"_orig_mod." + n: t.detach().to(torch.float32) for n, t in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as d:
        pt = os.path.join(d, "model.pt")
        torch.save(sd, pt)
        tensors, meta = convert(torch.load(pt, map_location="cpu", weights_only=True), cfg)
    V = cfg["vocab_size"]
    rows = torch.randint(V, (B, T + 1), generator=g)
    idx, targets = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    targets[0, :3] = -1  # ignored positions, as nanochat's ignore_index
    # the original in float64 (the substitutions above) on the checkpoint's fp32 values
    model.load_state_dict({n.removeprefix("_orig_mod."): t.to(F64) for n, t in sd.items()})
    with torch.no_grad(), keep_float64():
        loss64 = model(idx, targets=targets).item()
    native = nanochat_native_loss(gpt_path, sd, idx, targets, cfg)
    save(os.path.join(out, "nanochat_checkpoint.safetensors"), tensors, meta)
    save(os.path.join(out, "nanochat_tokens.safetensors"), {"idx": idx, "targets": targets},
         dict(val_loss=repr(loss64), val_loss_fp32_native=repr(native),
              source=f"nanochat {NANOCHAT_COMMIT[:7]} GPT.forward(idx, targets): val_loss in float64 with the "
                     "substitutions, val_loss_fp32_native the unchanged original at its CPU dtype (fp32)",
              substitutions=NANOCHAT_SUBST))
    print("nanochat loss float64:", loss64, "native fp32:", native)


def nanochat_native_loss(gpt_path, sd, idx, targets, cfg):
    """The original unchanged (fp32 on the CPU, no substitutions): its loss, for the record."""
    import subprocess, tempfile, json
    with tempfile.TemporaryDirectory() as d:
        torch.save({"sd": sd, "idx": idx, "targets": targets, "cfg": cfg}, os.path.join(d, "in.pt"))
        code = ("import sys,torch;sys.path.insert(0,sys.argv[1]);import nanochat.gpt as gpt;"
                "a=torch.load(sys.argv[2]);m=gpt.GPT(gpt.GPTConfig(**a['cfg']));m.init_weights();"
                "m.load_state_dict({k.removeprefix('_orig_mod.'):v for k,v in a['sd'].items()});"
                "print(repr(m(a['idx'],targets=a['targets']).item()))")
        r = subprocess.run([sys.executable, "-c", code, os.path.abspath(gpt_path), os.path.join(d, "in.pt")],
                           capture_output=True, text=True, check=True)
        return float(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--nanochat", required=True, help="a nanochat checkout at 92d63d4 (the folder holding nanochat/)")
    p.add_argument("--skip-fla", action="store_true")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    gpt = load_nanochat(a.nanochat)
    # 4 layers SSSL; sequence_len 256 gives short windows of 128 left keys, so T = 160 crosses them;
    # vocab 60 is padded to 64 rows by nanochat
    cfg = dict(sequence_len=256, vocab_size=60, n_layer=4, n_head=2, n_kv_head=2, n_embd=32, window_pattern="SSSL")
    nanochat_golden(gpt, a.out, cfg, B=2, T=160, seed=1)
    # grouped-query attention (one KV head for two query heads, one value-embedding gate per KV
    # head), every layer full: mixbench's gqa
    nanochat_golden(gpt, a.out, dict(cfg, n_kv_head=1, window_pattern="L"), B=1, T=64, seed=8, method="gqa",
                    name="nanochat_gqa")
    nanochat_checkpoint(gpt, a.nanochat, a.out, cfg, B=3, T=200, seed=2)
    if not a.skip_fla:
        import make_fla_layer_goldens
        make_fla_layer_goldens.main_all(a.out)


if __name__ == "__main__":
    main()
