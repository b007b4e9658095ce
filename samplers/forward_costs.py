"""Seconds per forward at each shape an adaptive drafter may choose (`Drafter.cost_shapes` / `set_costs`),
timed on the generation's session once per model, batch, guidance, compile setting, thread count and target
mode (batch-invariant forwards cost more), and
kept per model while it lives (never written into the model)."""
from __future__ import annotations

import time
import weakref

import torch

_FORWARD_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def calibrate(model, drafter, session, batch: int, compile: bool, sync, target_mode, pin_width=None) -> None:
    """Give `drafter` its forward costs, timed now unless kept from an earlier generation (with the shapes pinned
    at `pin_width`: every shape costs one forward of that width). The forwards write only cache slots past the
    committed prefix, which every later forward overwrites before reading: the generation is unchanged."""
    shapes = drafter.cost_shapes()
    if not shapes:
        return
    kept = _FORWARD_COSTS.setdefault(model, {})
    key = (batch, session.cfg, compile, torch.get_num_threads(), target_mode, pin_width,
           tuple(len(parents) for parents in shapes.values()))
    if key not in kept:
        with target_mode():
            if pin_width is None:
                kept[key] = time_forwards(model, session, shapes, batch, sync)
            else:
                pinned = time_forwards(model, session, {"pinned": [-1] * pin_width}, batch, sync)["pinned"]
                kept[key] = dict.fromkeys(shapes, pinned)
    drafter.set_costs(kept[key])


def time_forwards(model, session, shapes: dict, batch: int, sync, rounds: int = 5) -> dict:
    """Seconds per forward of each shape: the fastest of `rounds` timings taken round-robin
    over the shapes (a load spike from another process then hits one timing of every shape,
    and the minimum drops it), smoothed by the least-squares line cost = a + b * tokens
    (b >= 0): a forward's cost grows with its tokens, and one bad timing must not make a
    bigger shape look cheaper than a smaller one (or the reverse)."""
    best = {w: float("inf") for w in shapes}
    for r in range(rounds + 1):  # round 0 warms up
        for w, parents in shapes.items():
            tokens = torch.zeros(batch, len(parents), dtype=torch.long, device=model.device)
            sync()
            t = time.perf_counter()
            model.forward(session, tokens, parents)
            sync()
            if r:
                best[w] = min(best[w], time.perf_counter() - t)
    n = [len(parents) for parents in shapes.values()]
    y = list(best.values())
    mean_n, mean_y = sum(n) / len(n), sum(y) / len(y)
    var = sum((x - mean_n) ** 2 for x in n)
    slope = max(sum((x - mean_n) * (v - mean_y) for x, v in zip(n, y)) / var, 0.0) if var else 0.0
    base = max(mean_y - slope * mean_n, min(y) * 0.5)
    return {w: base + slope * len(parents) for w, parents in shapes.items()}
