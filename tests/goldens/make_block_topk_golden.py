#!/usr/bin/env python3
"""Make golden files of op block_topk with torch.topk, whose selections differ from mixbench's
stable sort (ties to the lower block) only among blocks tied with the k-th score.

    python3 tests/goldens/make_block_topk_golden.py tests/goldens

Needs only torch (the safetensors file is written by hand). Each file holds `scores` [B,S,T,N]
(ReLU of small integers: most blocks tie, many at exactly 0, as qsa's ReLU indexer) and
`expected_block_indices` [B,S,T,K], with `op`, `block_size`, `topk` and `own` in the metadata:
  own=appended (nsa, seer, qsa): candidates are the complete history blocks i < c = t // block_size;
    the min(topk, N) best by torch.topk (-1 where there are fewer), then the own block c;
  own=counted (moba): the own block c first, then the min(topk, N) - 1 best of the blocks i < c.
torch.topk runs on the candidates in reversed block order, so among tied blocks it keeps other ones
than a stable sort; the script checks that the selections differ in some rows.
"""
import json
import struct
import sys

import torch


def topk_rows(cand, k):
    """Indices of the k best entries of each row of cand (-inf = no candidate), -1 padded."""
    n = cand.shape[-1]
    if k == 0 or n == 0:
        return torch.full(cand.shape[:-1] + (k,), -1, dtype=torch.long)
    kk = min(k, n)
    vals, idx = torch.topk(cand.flip(-1), kk, dim=-1)
    idx = (n - 1 - idx).masked_fill(vals == float("-inf"), -1)
    if kk < k:
        idx = torch.cat([idx, torch.full(idx.shape[:-1] + (k - kk,), -1, dtype=torch.long)], -1)
    return idx


def stable_rows(cand, k):
    vals, idx = torch.sort(cand, dim=-1, descending=True, stable=True)
    idx, vals = idx[..., :k], vals[..., :k]
    return idx.masked_fill(vals == float("-inf"), -1)


def select(scores, block, topk, own, rows):
    B, S, T, N = scores.shape
    t = torch.arange(T)
    cur = (t // block).view(1, 1, T, 1)
    blk = torch.arange(N).view(1, 1, 1, N)
    cand = scores.masked_fill(blk >= cur, float("-inf"))  # history blocks i < c
    k = min(topk, N) if own == "appended" else min(topk, N) - 1
    hist = rows(cand, k)
    own_col = cur.expand(B, S, T, 1)
    return torch.cat([hist, own_col] if own == "appended" else [own_col, hist], -1)


def save(path, tensors, meta):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        data = bytes(t.view(torch.uint8).flatten().tolist())
        header[name] = {"dtype": {torch.float64: "F64", torch.int64: "I64"}[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def golden(path, B, S, T, block, topk, own, seed):
    g = torch.Generator().manual_seed(seed)
    N = T // block if own == "appended" else -(-T // block)
    scores = torch.relu(torch.randint(-2, 3, (B, S, T, N), generator=g).to(torch.float64))
    sel = select(scores, block, topk, own, topk_rows)
    stable = select(scores, block, topk, own, stable_rows)
    differ = int((torch.sort(sel, -1).values != torch.sort(stable, -1).values).any(-1).sum())
    assert differ > 0, "torch.topk kept the same tied blocks as a stable sort: pick another seed"
    meta = dict(op="block_topk", block_size=str(block), topk=str(topk), own=own,
                source="torch.topk (tests/goldens/make_block_topk_golden.py)")
    save(path, {"scores": scores, "expected_block_indices": sel}, meta)
    print(f"{path}: {differ} of {B * S * T} rows keep other tied blocks than a stable sort")


def main(out):
    golden(f"{out}/torch_block_topk_appended_ties.safetensors", 2, 2, 29, 2, 4, "appended", 11)
    golden(f"{out}/torch_block_topk_counted_ties.safetensors", 2, 2, 29, 3, 3, "counted", 12)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
