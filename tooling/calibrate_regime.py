"""`python -m specar.tooling calibrate-regime`: the temperature of the `paper` bench regime.

A scan of temperatures, then bisection on log-temperature (CFG and top-k fixed), for the demo model until
the probe configuration (PAPER_PROBE) commits the target step compression (all image tokens / all forwards,
as the papers' NFE ratios; PAPER_TARGET_SOURCE) on the bench's default prompts x the seeds; writes
cli/regime_paper.json, which `python -m specar bench --regime paper` reads (cli/regimes.py).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from typing import Callable

from ..cli.args import non_negative_int, positive_float, positive_int
from ..cli.regimes import DEMO_SAMPLING, calibration_path

# the published figure the `paper` regime is calibrated to: SJD (L=16, random init) on Lumina-mGPT 7B,
# MS-COCO 2017, step compression 2.22x (Teng et al., "Speculative Jacobi Decoding", Table 1, row C)
PAPER_TARGET = 2.22
PAPER_TARGET_SOURCE = "SJD (Teng et al.) Table 1, Lumina-mGPT, MS-COCO 2017: SJD L=16 step compression 2.22x"
# the configuration the calibration measures: the SJD paper's setting, each backend's own rejection sampling
PAPER_PROBE = "sjd:preset=paper,reproducible=false"
# the settings the calibration keeps fixed: at the papers' CFG (the demo model's own) no temperature in [1, 16]
# brings the demo model's SJD below about 2.6 tokens per forward (per-image mean, 16 images;
# docs/history/BENCHMARKS-2026-11-27.md)
PAPER_FIXED = {"cfg_scale": 6.0, "top_k": 0}
# what the papers' step figures are: AR's forwards / the method's mean forwards per image (SCD Table 1 gives the
# NFE itself), i.e. the bench's `step_compression_total` (all image tokens / all forwards), not the mean of
# per-image ratios (which easy images pull up: 2.60 against 2.25 on the 8 images of
# docs/figures/bench_regime_paper.json)
CALIBRATED_METRIC = "step_compression_total"
# the prompts and seeds the calibration measures on: the bench's default prompts x these seeds
CALIBRATION_SEEDS = (0, 1, 2, 3)


# -- calibration --------------------------------------------------------------------------------------------


def measure_step_compression(model, config: dict, prompts, seeds, sampling: dict) -> dict:
    """Step compression of one configuration at these sampling settings: the mean of per-image ratios
    (the bench's `step_compression`) and all tokens / all forwards, on every prompt x seed."""
    from ..cli.schema import generate_args
    from ..samplers.api import generate
    per_image, tokens, forwards = [], 0, 0
    for prompt in prompts:
        for seed in seeds:
            stats = generate(model, prompt, seed=seed, sampling=sampling, **generate_args(config)).stats
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


def add_arguments(ap) -> None:
    ap.add_argument("name", choices=["paper"], help="the regime to calibrate")
    ap.add_argument("--target", type=positive_float, default=PAPER_TARGET,
                    help=f"step compression to reach ({PAPER_TARGET_SOURCE})")
    ap.add_argument("--seeds", type=non_negative_int, nargs="+", default=list(CALIBRATION_SEEDS),
                    help="seeds; every one of the bench's default prompts runs with every seed")
    ap.add_argument("--cfg-scale", type=positive_float, default=PAPER_FIXED["cfg_scale"],
                    help=f"CFG scale, fixed during the search (at the papers' {DEMO_SAMPLING['cfg_scale']} no "
                    f"temperature reaches {PAPER_TARGET} on the demo model: docs/history/BENCHMARKS-2026-11-27.md)")
    ap.add_argument("--top-k", type=non_negative_int, default=PAPER_FIXED["top_k"],
                    help="top-k, fixed during the search (0: every code)")
    ap.add_argument("--lo", type=positive_float, default=1.0, help="lowest temperature searched")
    ap.add_argument("--hi", type=positive_float, default=8.0, help="highest temperature searched")
    ap.add_argument("--scan", type=positive_int, default=7, help="log-spaced temperatures measured before the "
                    "bisection (at least 2)")
    ap.add_argument("--tolerance", type=positive_float, default=0.03, help="relative tolerance on the target")
    ap.add_argument("--max-evaluations", type=positive_int, default=12, help="most temperatures measured")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    ap.add_argument("--out", default=None, help=f"the calibration file (unset: {calibration_path('paper')}, which "
                    "the `paper` regime reads)")


def run(args):
    """Search the temperature, write the calibration file."""
    import torch

    from ..cli.bench import DEFAULT_PROMPTS
    from ..cli.benchmark import parse_config
    from ..cli.machine import machine
    from ..cli.model_spec import model_from_spec
    if args.lo >= args.hi:
        raise ValueError(f"--lo ({args.lo}) must be below --hi ({args.hi})")
    if args.scan < 2:
        raise ValueError(f"--scan must be at least 2, got {args.scan}")
    torch.set_num_threads(args.threads)
    model = model_from_spec("demo")
    probe = parse_config(PAPER_PROBE)
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
        "tolerance": args.tolerance, "prompts": f"bench default ({len(DEFAULT_PROMPTS)})", "seeds": args.seeds,
        "evaluations": [{k: round(v, 4) for k, v in h.items()} for h in found["evaluations"]],
        "command": args.command_line, **machine(),  # counts do not depend on the load; the wall time does
        "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{args.name}: temperature {found['temperature']} -> {PAPER_PROBE} step compression "
          f"{found['step_compression']:.3f} ({CALIBRATED_METRIC}; target {args.target}); written to {out}")
    return result


__all__ = ["CALIBRATED_METRIC", "PAPER_PROBE", "PAPER_TARGET", "calibrate_temperature", "measure_step_compression"]
