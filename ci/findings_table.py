#!/usr/bin/env python3
"""Collects `mixbench tasks` reports (one per method x setting x seed, as ci/gpu_findings.sh writes
them) into one findings table: per method, setting and learning rate the held-out accuracy of every
seed with mean, sample standard deviation and range, and per method and setting the learning rate
whose mean is best (Zoology's protocol: each method at its best swept learning rate).

Usage: ci/findings_table.py DIR... [--out PREFIX]   (writes PREFIX.json and PREFIX.md; default: print)
"""
import argparse
import json
import math
import os
import re
import sys
from collections import defaultdict


def reports(paths):
    for root in paths:
        for d, _, files in os.walk(root):
            for f in sorted(files):
                if not f.endswith(".json"):
                    continue
                try:
                    rep = json.load(open(os.path.join(d, f)))
                except (OSError, ValueError):
                    continue
                if rep.get("kind") == "tasks":
                    yield os.path.join(d, f), rep


def lr_of(rep):
    m = re.search(r"lr ([0-9.eE+-]+)", rep.get("config", {}).get("optimizer", ""))
    return float(m.group(1)) if m else None


def stats(xs):
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return mean, sd, min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out")
    a = ap.parse_args()
    cells = defaultdict(dict)  # (method, setting label, vocab, lr, steps) -> {seed: accuracy}
    meta = {}
    for path, rep in reports(a.dirs):
        lr = lr_of(rep)
        for r in rep["results"]:
            if r.get("status") != "ok":
                continue
            s = r["setting"]
            key = (r["method"], r["task"], s.get("pairs", 0), s["length"], s["d_model"], s.get("vocab"),
                   s.get("test_length", s["length"]), lr, r["steps"])
            cells[key][r["seed"]] = r["accuracy"]
            meta[key] = {"chance": r["chance"], "command": rep.get("command"), "git_commit": rep.get("git_commit")}
    if not cells:
        sys.exit("no tasks reports with finished rows under " + ", ".join(a.dirs))
    rows = []
    for key in sorted(cells, key=lambda k: tuple("" if v is None else v for v in k)):
        method, task, pairs, length, width, vocab, test_len, lr, steps = key
        accs = [cells[key][s] for s in sorted(cells[key])]
        mean, sd, lo, hi = stats(accs)
        rows.append({"method": method, "task": task, "pairs": pairs, "length": length, "d_model": width, "vocab": vocab,
                     "test_length": test_len, "lr": lr, "steps": steps, "seeds": sorted(cells[key]), "accuracy": accs,
                     "mean": mean, "sd": sd, "min": lo, "max": hi, "chance": meta[key]["chance"]})
    # each method's best learning rate per setting (by mean held-out accuracy)
    best = {}
    for r in rows:
        k = (r["method"], r["task"], r["pairs"], r["length"], r["d_model"], r["vocab"], r["test_length"], r["steps"])
        if k not in best or r["mean"] > best[k]["mean"]:
            best[k] = r
    for r in rows:
        k = (r["method"], r["task"], r["pairs"], r["length"], r["d_model"], r["vocab"], r["test_length"], r["steps"])
        r["best_lr"] = best[k] is r
    md = ["| method | task | pairs | length | d | vocab | test length | lr | steps | seeds | mean ± sd | range | chance | best lr |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for r in rows:
        md.append(f"| {r['method']} | {r['task']} | {r['pairs'] or ''} | {r['length']} | {r['d_model']} | {r['vocab']} | "
                  f"{r['test_length']} | {r['lr']:g} | {r['steps']} | {len(r['seeds'])} | {r['mean']:.3f} ± {r['sd']:.3f} | "
                  f"{r['min']:.3f}–{r['max']:.3f} | {r['chance']:.4f} | {'yes' if r['best_lr'] else ''} |")
    text = "\n".join(md) + "\n"
    if a.out:
        tmp = a.out + ".json.tmp"
        json.dump({"rows": rows}, open(tmp, "w"), indent=1)
        os.replace(tmp, a.out + ".json")
        tmp = a.out + ".md.tmp"
        open(tmp, "w").write(text)
        os.replace(tmp, a.out + ".md")
    print(text)


if __name__ == "__main__":
    main()
