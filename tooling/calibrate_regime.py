"""`python -m specar calibrate-regime paper`: the `paper` bench regime's temperature (cli/regimes.py reads
the result). Its own module: it runs the bench's models and prompts (cli/benchmark.py), which itself reads
the regimes (so the regimes cannot import the bench back)."""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Callable

from .args import non_negative_int, parse_command, positive_float, positive_int
from .regimes import (CALIBRATED_METRIC, CALIBRATION_SEEDS, PAPER_FIXED, PAPER_PROBE, PAPER_TARGET,
                      PAPER_TARGET_SOURCE, calibration_path)


# -- calibration --------------------------------------------------------------------------------------------


def measure_step_compression(model, config: dict, prompts, seeds, sampling: dict) -> dict:
    """Step compression of one configuration at these sampling settings: the mean of per-image ratios
    (the bench's `step_compression`) and all tokens / all forwards, on every prompt x seed."""
    from ..samplers.api import generate
    per_image, tokens, forwards = [], 0, 0
    for prompt in prompts:
        for seed in seeds:
            stats = generate(model, prompt, seed=seed, **sampling, **config).stats
            per_image.append(stats.step_compression)
            tokens += stats.image_tokens * stats.batch
            forwards += sum(n + 1 for n in stats.steps)
    return {"step_compression": statistics.mean(per_image), "step_compression_total": tokens / forwards,
            "images": len(per_image)}


def calibrate_temperature(measure: Callable[[float], float], target: float, lo: float = 1.0, hi: float = 16.0,
                          tolerance: float = 0.03, max_evaluations: int = 12, scan: int = 5, log=None) -> dict:
    """The lowest temperature at which `measure(temperature)` (a step compression) crosses `target`, within
    `tolerance` (relative). The step compression need not be monotone in the temperature (flat enough, the
    drafts are accepted again), so: measure `scan` log-spaced temperatures from lo to hi, take the first
    neighbouring pair (from lo up) whose values bracket the target, and bisect on log-temperature inside it
    until a point of the bracket is within the tolerance. Returns that point (the closest of the bracket's),
    every evaluation, and `reached` (within the tolerance). ValueError, with the scanned values, when no
    neighbouring pair brackets the target (the search cannot land there)."""
    history = []

    def at(t):
        t = round(t, 4)
        value = measure(t)
        history.append({"temperature": t, "step_compression": value})
        if log:
            log(f"temperature {t:.4f}: step compression {value:.3f} (target {target})")
        return t, value

    points = [at(math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (scan - 1))) for i in range(scan)]
    bracket = next(((a, b) for a, b in zip(points, points[1:]) if min(a[1], b[1]) <= target <= max(a[1], b[1])), None)
    if bracket is None:
        scanned = ", ".join(f"{t:g}: {v:.3f}" for t, v in points)
        raise ValueError(f"target step compression {target} is not between the values of two neighbouring scanned "
                         f"temperatures ({scanned}); choose other --lo/--hi or other fixed sampling settings")
    (ta, fa), (tb, fb) = bracket
    inside = list(bracket)
    close = lambda: min(abs(v - target) for _, v in inside) <= tolerance * target  # noqa: E731
    while not close() and len(history) < max_evaluations:
        t, value = at(math.exp((math.log(ta) + math.log(tb)) / 2))
        inside.append((t, value))
        if (value > target) == (fa > target):  # on the low end's side: the crossing is above t
            ta, fa = t, value
        else:
            tb, fb = t, value
    best_t, best_v = min(inside, key=lambda p: abs(p[1] - target))
    return {"temperature": best_t, "step_compression": best_v, "reached": abs(best_v - target) <= tolerance * target,
            "evaluations": history}


CALIBRATE_DOC = f"""`python -m specar calibrate-regime paper`: the temperature of the `paper` regime.

A scan of temperatures, then bisection on log-temperature (CFG and top-k fixed), for the demo model until
`{PAPER_PROBE}` commits the target step compression (all image tokens / all forwards, as
the papers' NFE ratios; default {PAPER_TARGET}: {PAPER_TARGET_SOURCE}) on the bench's
4 default prompts x the seeds; writes cli/regime_paper.json, which `bench --regime paper` reads.
"""


def add_arguments(ap) -> None:
    ap.add_argument("name", choices=["paper"], help="the regime to calibrate")
    ap.add_argument("--target", type=positive_float, default=PAPER_TARGET,
                    help=f"step compression to reach ({PAPER_TARGET_SOURCE})")
    ap.add_argument("--seeds", type=non_negative_int, nargs="+", default=list(CALIBRATION_SEEDS),
                    help="seeds; every one of the bench's 4 default prompts runs with every seed")
    ap.add_argument("--cfg-scale", type=positive_float, default=PAPER_FIXED["cfg_scale"],
                    help="CFG scale, fixed during the search (at the papers' 3.0 no temperature reaches 2.22 on the "
                    "demo model: docs/BENCHMARKS.md)")
    ap.add_argument("--top-k", type=non_negative_int, default=PAPER_FIXED["top_k"],
                    help="top-k, fixed during the search (0: every code)")
    ap.add_argument("--lo", type=positive_float, default=1.0, help="lowest temperature searched")
    ap.add_argument("--hi", type=positive_float, default=8.0, help="highest temperature searched")
    ap.add_argument("--scan", type=positive_int, default=7, help="log-spaced temperatures measured before the "
                    "bisection (at least 2)")
    ap.add_argument("--tolerance", type=positive_float, default=0.03, help="relative tolerance on the target")
    ap.add_argument("--max-evaluations", type=positive_int, default=12, help="most temperatures measured")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    ap.add_argument("--out", default=None, help="the calibration file (default: cli/regime_paper.json, which the "
                    "`paper` regime reads)")


def main(argv=None):
    """`python -m specar calibrate-regime paper`: search the temperature, write the calibration file."""
    import torch

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_command("calibrate-regime", CALIBRATE_DOC, add_arguments, argv)

    from .benchmark import DEFAULT_PROMPTS, _load_average, _model, cpu_name, parse_config
    if args.lo >= args.hi:
        raise ValueError(f"--lo ({args.lo}) must be below --hi ({args.hi})")
    torch.set_num_threads(args.threads)
    model = _model("demo", None, None)
    probe = parse_config(PAPER_PROBE)
    if args.scan < 2:
        raise ValueError(f"--scan must be at least 2, got {args.scan}")
    fixed = {"cfg_scale": args.cfg_scale, "top_k": args.top_k}
    t0 = time.time()
    found = calibrate_temperature(
        lambda t: measure_step_compression(model, probe, DEFAULT_PROMPTS, args.seeds,
                                           {**fixed, "temperature": t})[CALIBRATED_METRIC],
        args.target, args.lo, args.hi, args.tolerance, args.max_evaluations, args.scan,
        log=lambda s: print(s, file=sys.stderr))
    if not found["reached"]:
        print(f"warning: closest step compression {found['step_compression']:.3f} is outside the tolerance "
              f"({args.tolerance:.0%}) of {args.target}", file=sys.stderr)
    out = args.out or calibration_path(args.name)
    result = {
        "regime": args.name, "target": args.target, "target_source": PAPER_TARGET_SOURCE, "probe": PAPER_PROBE,
        "model": "demo", "sampling": {**fixed, "temperature": found["temperature"]},
        "metric": CALIBRATED_METRIC, "step_compression": round(found["step_compression"], 4),
        "reached": found["reached"],
        "tolerance": args.tolerance, "prompts": "bench default (4)", "seeds": args.seeds,
        "evaluations": [{k: round(v, 4) for k, v in h.items()} for h in found["evaluations"]],
        "command": "python -m specar calibrate-regime " + " ".join(argv),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1),
        "load_average": _load_average(),  # counts do not depend on it; the wall time does
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{args.name}: temperature {found['temperature']} -> {PAPER_PROBE} step compression "
          f"{found['step_compression']:.3f} ({CALIBRATED_METRIC}; target {args.target}); written to {out}")
    return result


__all__ = ["calibrate_temperature", "measure_step_compression"]
