"""What a target forward costs in each same-image route for half precision on this machine: plain forwards at a width
(what shape pinning runs: AR padded to it, the backend at it) against float64 batch-invariant forwards
(model_loaders/precision/batch_invariant.py) at 1 token (AR) and at the width (a backend).

    PYTHONPATH=... python tooling/pinned_forward_cost.py --widths 1 8 17 23 --json out.json

Each figure is the least CPU time (`time.process_time`: the time this process ran, not the time other processes
held the cores; run it with one thread) of `--repeats` forwards with CFG, batch 1, over the session's cache, taken
round-robin over every width and mode after one untimed round: on a loaded shared machine wall-clock times of a
forward measure the other processes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch

import specar
from specar.model_loaders.precision.batch_invariant import BatchInvariant


def fastest_ms(model, session, widths: list, repeats: int) -> dict:
    """{(width, mode): the fastest of `repeats` forwards}, taken round-robin over every width and mode (a quiet moment
    of a shared machine then serves them all), after one untimed round."""
    modes = {"plain": contextlib.nullcontext, "float64": BatchInvariant}
    best = {}
    for r in range(repeats + 1):
        for w in widths:
            tokens, parents = torch.zeros(1, w, dtype=torch.long), list(range(-1, w - 1))
            for name, mode in modes.items():
                with mode():
                    t = time.process_time()
                    model.forward(session, tokens, parents)
                    dt = time.process_time() - t
                if r:
                    best[w, name] = min(best.get((w, name), dt), dt)
    return {k: round(1e3 * v, 3) for k, v in best.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--widths", nargs="+", type=int, default=[1, 8, 17, 23])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from specar.cli.machine import machine
    meta = {"command": "python tooling/pinned_forward_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), **machine()}
    model = specar.load_model(a.model, dtype=a.dtype)
    rows = []
    with torch.inference_mode():
        session = model.start(model.encode_prompt("a red circle", ""), 1, True, draft_capacity=max(a.widths) + 1)
        ms = fastest_ms(model, session, a.widths, a.repeats)
    for w in a.widths:
        rows.append({"width": w, "plain_ms": ms[w, "plain"], "float64_ms": ms[w, "float64"]})
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "model": a.model, "dtype": a.dtype, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
