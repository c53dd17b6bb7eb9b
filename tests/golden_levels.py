#!/usr/bin/env python3
"""Layer- and model-level goldens, checkpoints in, and the goldens from the original
implementations, through the mixbench command line (standard library only).

    python3 tests/golden_levels.py BUILD_DIR/mixbench

  - `golden --method ... --level layer|model` files (mixbench's, nanochat's and fla's names) pass
    `conformance --golden` at fp64 and fp32; a perturbed output and a perturbed gradient fail (exit 1)
  - a malformed file, an unknown parameter name, a missing parameter and a shape that contradicts
    the config are errors (exit 2) naming the tensor
  - tests/goldens/original: nanochat's GPT as `dense` and `gqa` (logits and every parameter gradient) and
    flash-linear-attention's GatedDeltaNet / DeltaNet as `gdn` / `deltanet` pass at fp64 and fp32
  - `eval --checkpoint` of the converted nanochat checkpoint reproduces the original's loss on the
    same tokens to 1e-6 and writes a valid report; `train --init-from` starts from it
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

MIXBENCH = os.path.abspath(sys.argv[1])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORIG = os.path.join(ROOT, "tests", "goldens", "original")
FAILS = []


def run(*args, expect=0, contains=None):
    r = subprocess.run([MIXBENCH, *args], capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = r.stdout + r.stderr
    ok = r.returncode == expect and (contains is None or contains in out)
    print(("ok   " if ok else "FAIL ") + " ".join(args) + f"  -> exit {r.returncode}")
    if not ok:
        FAILS.append(" ".join(args))
        print(out[-3000:])
    return out


# ---- a safetensors file without torch: header JSON + raw bytes
def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def write_st(path, header, tensors_bytes):
    """header: {name: {dtype, shape}} in order plus __metadata__; tensors_bytes: {name: bytes}."""
    out, off, h = b"", 0, {}
    for name, info in header.items():
        if name == "__metadata__":
            h[name] = info
            continue
        b = tensors_bytes[name]
        h[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [off, off + len(b)]}
        out += b
        off += len(b)
    hj = json.dumps(h).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + out)


def tensors_of(path):
    header, data = read_st(path)
    return header, {n: data[i["data_offsets"][0]:i["data_offsets"][1]] for n, i in header.items() if n != "__metadata__"}


def edited(src, dst, fn):
    header, tb = tensors_of(src)
    fn(header, tb)
    write_st(dst, header, tb)
    return dst


def scale_first(header, tb, name, factor):
    """Multiplies the tensor's first element (F64 or F32) by factor."""
    fmt = {"F64": "<d", "F32": "<f"}[header[name]["dtype"]]
    w = struct.calcsize(fmt)
    b = bytearray(tb[name])
    v = struct.unpack(fmt, b[:w])[0]
    b[:w] = struct.pack(fmt, v * factor + (1e-3 if v == 0 else 0))
    tb[name] = bytes(b)


def main():
    tmp = tempfile.mkdtemp(prefix="mixbench_golden_levels_")
    try:
        # ---- round trips: written by golden, passed by conformance at fp64 and fp32
        files = {}
        for method, level, names, extra in [("gdn", "layer", "", []), ("kda", "layer", "fla", []),
                                            ("retnet", "layer", "fla", []),
                                            ("dense", "layer", "nanochat", ["--layer", "3"]),
                                            ("dense", "model", "nanochat", []), ("dense_full", "model", "", [])]:
            f = os.path.join(tmp, f"{method}_{level}_{names or 'mixbench'}.safetensors")
            args = ["golden", "--method", method, "--level", level, "--out", f, "--batch", "2", *extra]
            if names:
                args += ["--names", names]
            run(*args)
            files[(method, level, names)] = f
        for dt in ("fp64", "fp32"):  # both paths of every file: 2 rows each
            run("conformance", "--golden", *files.values(), "--dtype", dt, "--quiet",
                contains=f"{2 * len(files)} passed, 0 failed, 0 skipped, 0 errors")
        run("golden", "--method", "retnet", "--level", "layer", "--names", "fla", "--layer", "1", "--out",
            os.path.join(tmp, "x.safetensors"), expect=2, contains="'ve_gate' has no name in the 'fla' scheme")
        run("list", "--names", "fla", contains="q_conv1d.weight")
        run("list", "--names", "nanochat", "--methods", "dense", contains="transformer.h.0.attn.c_q.weight")

        # ---- a perturbed output and a perturbed gradient fail
        g = files[("gdn", "layer", "")]
        run("conformance", "--golden", edited(g, os.path.join(tmp, "bad_y.safetensors"), lambda h, t: scale_first(h, t, "y", 1.01)),
            "--quiet", expect=1)
        run("conformance", "--golden",
            edited(g, os.path.join(tmp, "bad_grad.safetensors"), lambda h, t: scale_first(h, t, "grad_q_proj", 1.01)),
            "--quiet", expect=1)
        m = files[("dense", "model", "nanochat")]
        run("conformance", "--golden",
            edited(m, os.path.join(tmp, "bad_mgrad.safetensors"),
                   lambda h, t: scale_first(h, t, "grad_transformer.h.1.attn.c_k.weight", 1.01)), "--quiet", expect=1)

        # ---- bad files: exit 2 naming the problem
        with open(os.path.join(tmp, "trunc.safetensors"), "wb") as f:
            f.write(open(g, "rb").read()[:100])
        run("conformance", "--golden", os.path.join(tmp, "trunc.safetensors"), expect=2)

        def rename(h, t, a, b):
            h[b] = h.pop(a)
            t[b] = t.pop(a)

        run("conformance", "--golden", edited(g, os.path.join(tmp, "unknown.safetensors"),
                                              lambda h, t: rename(h, t, "q_proj", "q_projection")),
            expect=2, contains="'q_projection'")
        run("conformance", "--golden", edited(m, os.path.join(tmp, "missing.safetensors"),
                                              lambda h, t: (h.pop("x0_lambdas"), t.pop("x0_lambdas"))),
            expect=2, contains="'x0_lambdas' is missing")

        def reshape(h, t):  # k_proj [64, 64] read as [32, 128]
            h["k_proj"]["shape"] = [h["k_proj"]["shape"][0] // 2, h["k_proj"]["shape"][1] * 2]
        run("conformance", "--golden", edited(g, os.path.join(tmp, "shape.safetensors"), reshape),
            expect=2, contains="'k_proj' has shape")

        def meta(h, t):  # the config says 32 wide, the tensors are 64 wide
            h["__metadata__"]["d_model"] = "32"
        run("conformance", "--golden", edited(g, os.path.join(tmp, "cfg.safetensors"), meta), expect=2)

        # ---- the originals
        # at fp32 the kda layer's A_log gradient lands at 1.6e-5 of the fp64 file (threshold 1e-5): its
        # conditioning at these random parameters (fla's norm_eps 1e-5; mixbench's own kda cases use
        # 1e-2 for that reason), so kda's file is checked at fp64 only
        originals = ["nanochat_dense", "nanochat_gqa", "fla_gdn_layer", "fla_deltanet_layer", "fla_kda_layer",
                     "fla_gla_layer", "fla_retnet_layer"]
        for dt in ("fp64", "fp32"):
            fs = [os.path.join(ORIG, f + ".safetensors") for f in originals if dt == "fp64" or f != "fla_kda_layer"]
            run("conformance", "--golden", *fs, "--dtype", dt, "--quiet",
                contains=f"{2 * len(fs)} passed, 0 failed, 0 skipped, 0 errors")

        # ---- eval --checkpoint reproduces the original's loss
        report = os.path.join(tmp, "eval.json")
        ckpt, tok = os.path.join(ORIG, "nanochat_checkpoint.safetensors"), os.path.join(ORIG, "nanochat_tokens.safetensors")
        run("eval", "--checkpoint", ckpt, "--tokens", tok, "--out", report)
        want = float(read_st(tok)[0]["__metadata__"]["val_loss"])
        got = json.load(open(report))["results"][0]["val_loss"] if os.path.exists(report) else float("nan")
        ok = abs(got - want) <= 1e-6
        print(("ok   " if ok else "FAIL ") + f"eval val_loss {got!r} vs the original's {want!r} (|diff| {abs(got - want):.3g})")
        if not ok:
            FAILS.append("eval loss")
        run("validate", report)
        native = float(read_st(tok)[0]["__metadata__"]["val_loss_fp32_native"])
        out = run("eval", "--checkpoint", ckpt, "--tokens", tok, "--dtype", "fp32", "--out", report)
        got32 = json.load(open(report))["results"][0]["val_loss"]
        ok = abs(got32 - native) <= 1e-5
        print(("ok   " if ok else "FAIL ") + f"eval fp32 {got32!r} vs the original at fp32 {native!r}")
        if not ok:
            FAILS.append("eval fp32 loss")
        run("eval", "--checkpoint", ckpt, "--tokens", tok, "--config", "n_layer=3", expect=2, contains="is not a parameter")
        run("eval", "--checkpoint", ckpt, "--tokens", tok, "--level", "layer", expect=2, contains="no validation loss")

        # ---- train --init-from: one layer's fla state dict into every block of a gdn model
        layer = os.path.join(tmp, "gdn_fla_state.safetensors")

        def state_only(h, t):
            for n in [n for n in h if n != "__metadata__" and (n in ("x", "y", "dy") or n.startswith("grad_"))]:
                h.pop(n)
                t.pop(n)
            h["__metadata__"] = {}
        edited(os.path.join(ORIG, "fla_gdn_layer.safetensors"), layer, state_only)
        gcfg = "n_layer=2,d_model=64,head_dim=16,seq_len=32,vocab=257"
        train_out = os.path.join(tmp, "train")
        run("train", "--method", "gdn", "--init-from", layer, "--init-level", "layer", "--config", gcfg, "--steps", "1",
            "--batch", "2", "--data", "synthetic", "--probes", "0", "--quiet", "--out", train_out)
        run("validate", os.path.join(train_out, "train.json"))
        run("train", "--method", "gdn", "--init-from", layer, "--init-level", "layer", "--config",
            gcfg.replace("head_dim=16", "head_dim=32"), "--steps", "1", "--batch", "2", "--data", "synthetic",
            "--probes", "0", "--quiet", expect=2, contains="has shape")
        run("train", "--method", "dense", "--init-from", ckpt, "--config",
            "n_layer=4,d_model=64,head_dim=32,seq_len=64,vocab=300", "--steps", "1", "--batch", "1",
            "--data", "synthetic", "--probes", "0", "--quiet", expect=2, contains="'transformer.wte.weight' has shape")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} failed:", *FAILS, sep="\n  ")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
