"""Tokens that differ from AR's in the same-image mode, per backend, seed and dtype (half precision).

    PYTHONPATH=... python devtools/half_same_image.py --model demo --dtypes bfloat16 float16 --seeds 0 1 2 3
    PYTHONPATH=... python devtools/half_same_image.py --model tiny --dtypes bfloat16 --seeds 0 1 2 3 4 5 6 7

Prints one line per (dtype, backend, seed): the number of image tokens that differ from AR's, and per
(dtype, backend) the images that differ. ``--invariant off``: plain half-precision forwards (the
batch-invariant mode of model_loaders/precision/batch_invariant.py never entered); default: generate's own choice.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch

import specar
from specar.model_loaders.precision import batch_invariant
from specar.testing import tiny_model

PROMPT = "a small yellow star on a noisy green background"


def load(name: str, dtype: str):
    if name == "demo":
        return specar.load_model("demo", dtype=dtype)
    m = tiny_model(vocab_size=64, grid=(8, 8), row_end=True, hidden_size=64, num_heads=4, seed=0)
    m.decoder.to(getattr(torch, dtype))
    return m


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--backends", nargs="+", default=["scd", "sjd_pac"])
    ap.add_argument("--invariant", choices=["off", "default"], default="default")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.invariant == "off":  # every target forward plain, the guarantee reported as "off"
        batch_invariant.plan = lambda model, reproducible: (contextlib.nullcontext, "off")
    rows = []
    for dtype in a.dtypes:
        model = load(a.model, dtype)
        ar = {s: specar.generate(model, PROMPT, backend="ar", seed=s) for s in a.seeds}
        for backend in a.backends:
            for s in a.seeds:
                r = specar.generate(model, PROMPT, backend=backend, seed=s)
                diff = int((r.tokens != ar[s].tokens).sum())
                rows.append(dict(model=a.model, dtype=dtype, backend=backend, seed=s, differing_tokens=diff,
                                 guarantee=getattr(r.stats, "same_image_guarantee", None)))
                print(json.dumps(rows[-1]), flush=True)
        for backend in a.backends:
            mine = [r for r in rows if r["dtype"] == dtype and r["backend"] == backend]
            print(f"{a.model} {dtype} {backend}: {sum(r['differing_tokens'] > 0 for r in mine)} of {len(mine)} images "
                  f"differ from AR's ({[r['differing_tokens'] for r in mine]} tokens)", flush=True)
    if a.json:
        from specar.cli.machine import machine
        meta = {"command": "python devtools/half_same_image.py " + " ".join(sys.argv[1:] if argv is None else argv),
                "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), **machine()}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
