"""What a target forward costs in each same-image route for half precision on this machine: plain forwards at a width
(what shape pinning runs: AR padded to it, the backend at it) against float64 batch-invariant forwards
(model_loaders/precision/batch_invariant.py) at 1 token (AR) and at the width (a backend).

    PYTHONPATH=... python devtools/pinned_forward_cost.py --widths 1 8 17 23 --json out.json

Each figure is the fastest of `--repeats` forwards (after one untimed) with CFG, batch 1, over the session's cache:
the minimum drops another process's interference on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import specar
from specar.model_loaders.precision.batch_invariant import BatchInvariant


def fastest_ms(model, session, width: int, repeats: int, mode) -> float:
    tokens = torch.zeros(1, width, dtype=torch.long)
    parents = list(range(-1, width - 1))
    best = float("inf")
    with mode():
        for r in range(repeats + 1):
            t = time.perf_counter()
            model.forward(session, tokens, parents)
            if r:
                best = min(best, time.perf_counter() - t)
    return round(1e3 * best, 3)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--widths", nargs="+", type=int, default=[1, 8, 17, 23])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import contextlib
    from specar.cli.machine import machine
    meta = {"command": "python devtools/pinned_forward_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), **machine()}
    model = specar.load_model(a.model, dtype=a.dtype)
    rows = []
    with torch.inference_mode():
        session = model.start(model.encode_prompt("a red circle", ""), 1, True, draft_capacity=max(a.widths) + 1)
        for w in a.widths:
            row = {"width": w, "plain_ms": fastest_ms(model, session, w, a.repeats, contextlib.nullcontext),
                   "float64_ms": fastest_ms(model, session, w, a.repeats, BatchInvariant)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "model": a.model, "dtype": a.dtype, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
