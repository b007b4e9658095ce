"""Tokens that differ from AR's in the same-image mode, per backend, prompt, seed and dtype (half precision).

    PYTHONPATH=... python tooling/half_same_image.py --model demo --dtypes bfloat16 float16 --seeds 0 1 2 3
    PYTHONPATH=... python tooling/half_same_image.py --model tiny --dtypes bfloat16 --seeds 0 1 2 3 4 5 6 7
    PYTHONPATH=... python tooling/half_same_image.py --dtypes bfloat16 --seeds 0 1 2 --prompts 2 --invariant pinned

Prints one line per (dtype, backend, prompt, seed): the number of image tokens that differ from AR's and the
seconds of the run and of its AR reference; and per (dtype, backend) the images that differ. ``--invariant``:
``default`` generate's own choice (on the CPU in half precision: the float64 batch-invariant mode of
model_loaders/precision/batch_invariant.py); ``off`` plain half-precision forwards (that mode never entered);
``pinned`` shape pinning alone (`RunOptions(pin_width=)`: the backend and its AR reference run every forward
at the backend's verify width, AR's one token padded).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

import specar
from specar.model_loaders.precision import batch_invariant
from specar.samplers.backends import make_backend
from specar.model_loaders.tiny import tiny_model

PROMPTS = ["a small yellow star on a noisy green background", "a large red circle on a blue background"]


def load(name: str, dtype: str):
    if name == "demo":
        return specar.load_model("demo", dtype=dtype)
    m = tiny_model(vocab_size=64, grid=(8, 8), row_end=True, hidden_size=64, num_heads=4, seed=0)
    m.decoder.to(getattr(torch, dtype))
    return m


def timed(model, prompt, backend, seed, pin_width):
    t = time.perf_counter()
    r = specar.generate(model, prompt, backend=backend, seed=seed, options=dict(pin_width=pin_width))
    return r, round(time.perf_counter() - t, 3)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--prompts", type=int, default=1, choices=range(1, len(PROMPTS) + 1),
                    help=f"how many of {PROMPTS} (in that order)")
    ap.add_argument("--backends", nargs="+", default=["scd", "sjd_pac"])
    ap.add_argument("--invariant", nargs="+", choices=["off", "default", "pinned"], default=["default"],
                    help="one or more modes; several run interleaved (each image in every mode in turn)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    prompts, product_plan, rows = PROMPTS[:a.prompts], batch_invariant.target_forward_mode, []
    off = lambda model, reproducible, pin_width=None: (  # noqa: E731 -- plain forwards
        contextlib.nullcontext, batch_invariant.SameImage.NOT_GUARANTEED, "plain forwards (half_same_image off)")
    for dtype in a.dtypes:
        model = load(a.model, dtype)
        widths = {b: make_backend(b).verify_width(model) for b in a.backends}
        ar = {}  # (mode, pinned width, prompt, seed) -> (result, seconds): pinned AR runs at each backend's width
        for backend in a.backends:
            for prompt in prompts:
                for s in a.seeds:
                    for mode in a.invariant:
                        batch_invariant.target_forward_mode = off if mode == "off" else product_plan
                        width = widths[backend] if mode == "pinned" else None
                        key = (mode, width, prompt, s)
                        if key not in ar:
                            ar[key] = timed(model, prompt, "ar", s, width)
                        r, sec = timed(model, prompt, backend, s, width)
                        diff = int((r.tokens != ar[key][0].tokens).sum())
                        rows.append(dict(model=a.model, dtype=dtype, backend=backend, prompt=prompt, seed=s,
                                         invariant=mode, differing_tokens=diff, pin_width=width, seconds=sec,
                                         ar_seconds=ar[key][1], forwards=r.stats.nfe,
                                         guarantee=getattr(r.stats, "same_image_guarantee", None)))
                        print(json.dumps(rows[-1]), flush=True)
                        if a.json:  # after every row: a run cut short keeps what it measured
                            write(a.json, argv, rows, complete=False)
        batch_invariant.target_forward_mode = product_plan
        for backend in a.backends:
            for mode in a.invariant:
                mine = [r for r in rows if r["dtype"] == dtype and r["backend"] == backend and r["invariant"] == mode]
                print(f"{a.model} {dtype} {backend} {mode}: {sum(r['differing_tokens'] > 0 for r in mine)} of "
                      f"{len(mine)} images differ from AR's ({[r['differing_tokens'] for r in mine]} tokens)",
                      flush=True)
    if a.json:
        write(a.json, argv, rows, complete=True)


def write(path: str, argv, rows: list, complete: bool) -> None:
    from specar.cli.machine import machine
    global _META
    if _META is None:  # the machine's load at the start
        _META = {"command": "python tooling/half_same_image.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), **machine()}
    with open(path + ".tmp", "w") as f:
        json.dump({"meta": {**_META, "complete": complete}, "rows": rows}, f, indent=1)
    os.replace(path + ".tmp", path)


_META = None


if __name__ == "__main__":
    main()
