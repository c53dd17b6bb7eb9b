#!/usr/bin/env python3
"""Convert a nanochat model checkpoint (.pt, a torch.save of GPT.state_dict()) to safetensors
that `mixbench eval --checkpoint` and `mixbench train --init-from` read.

    python3 ci/nanochat_to_safetensors.py model_000500.pt out.safetensors [--meta meta_000500.json]

torch.compile's "_orig_mod." prefixes are stripped (as nanochat's checkpoint_manager does). The
tensors keep nanochat's names and dtypes (bf16 embeddings stay bf16; mixbench converts on reading).
With --meta (nanochat's meta_<step>.json beside the model file) its model_config becomes the file's
metadata (sequence_len, vocab_size, n_layer, n_head, n_kv_head, n_embd, window_pattern), from which
mixbench derives its config.
"""
import argparse
import json
import sys

import torch

CONFIG_KEYS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "window_pattern")


def convert(state_dict, model_config=None):
    """(tensors, metadata) for safetensors: names without _orig_mod., contiguous CPU tensors."""
    tensors = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise SystemExit(f"entry {name!r} is not a tensor: is this a model state dict?")
        name = name.removeprefix("_orig_mod.")
        if name in tensors:
            raise SystemExit(f"tensor {name!r} appears twice")
        tensors[name] = t.detach().cpu().contiguous()
    if "transformer.wte.weight" not in tensors:
        raise SystemExit("no transformer.wte.weight: not a nanochat GPT state dict")
    meta = {"format": "nanochat-state-dict", "source": "nanochat GPT.state_dict()"}
    for k in CONFIG_KEYS:
        if model_config and k in model_config:
            meta[k] = str(model_config[k])
    return tensors, meta


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="nanochat model_<step>.pt")
    p.add_argument("out", help="output .safetensors")
    p.add_argument("--meta", help="nanochat meta_<step>.json (its model_config becomes metadata)")
    a = p.parse_args()
    from safetensors.torch import save_file
    sd = torch.load(a.checkpoint, map_location="cpu", weights_only=True)
    cfg = None
    if a.meta:
        with open(a.meta) as f:
            cfg = json.load(f).get("model_config")
    tensors, meta = convert(sd, cfg)
    save_file(tensors, a.out, metadata=meta)
    print(f"wrote {a.out}: {len(tensors)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
