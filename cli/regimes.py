"""Benchmark regimes (`python -m specar bench --regime NAME`) and `python -m specar calibrate-regime`.

A regime fixes what a benchmark's counts depend on besides the backend: the target model, its sampling
settings (and with the model, the grid), and the verification mode where the regime's figures need one.
Its counts (step compression = tokens per forward, forwards, accepted lengths) do not depend on the
machine's load, so regimes are compared by them; wall-clock only as ratios within one run.

- `demo`: today's benchmark: the embedded demo model at its own sampling (CFG 3, top-k 256 of 1024 codes,
  temperature 1). Its targets are sharply peaked: SJD commits about 7.6 tokens per forward there.
- `paper`: the demo model with its temperature calibrated (`calibrate-regime paper`, result in
  `cli/regime_paper.json`) so that `sjd:preset=paper` (window 16, random init, its own rejection sampling)
  commits what SJD commits on Lumina-mGPT 7B in the SJD paper (Teng et al., Table 1: 2.22x step
  compression), at CFG 6 and no top-k: at the papers' CFG 3 no temperature gets the demo model below
  about 2.6 per image in a 16-image scan (its images are simple; docs/BENCHMARKS.md has the scan).
- `flat`: a random-weight Llama-style target (`testing.tiny_model`) with flat next-token distributions,
  8192 codes on a 16x16 grid with row ends, sampled as the papers sample Lumina-mGPT (top-k 2000,
  temperature 1, CFG 3). Trained backends (hawk, adt_tree, spatial) run random-weight drafters there.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from .args import non_negative_int, parse_command, positive_float, positive_int

CALIBRATION_DIR = os.path.dirname(os.path.abspath(__file__))
# the published figure the `paper` regime is calibrated to: SJD (L=16, random init) on Lumina-mGPT 7B,
# MS-COCO 2017, step compression 2.22x (Teng et al., "Speculative Jacobi Decoding", Table 1, row C)
PAPER_TARGET = 2.22
PAPER_TARGET_SOURCE = "SJD (Teng et al.) Table 1, Lumina-mGPT, MS-COCO 2017: SJD L=16 step compression 2.22x"
# the configuration the calibration measures: the SJD paper's setting, each backend's own rejection sampling
PAPER_PROBE = "sjd:preset=paper,reproducible=false"
# the settings the calibration keeps fixed (its command's defaults): at the papers' CFG 3 (top-k 256) no
# temperature in [1, 16] brings the demo model's SJD below about 2.6 tokens per forward (per-image mean,
# 16 images; docs/BENCHMARKS.md)
PAPER_FIXED = {"cfg_scale": 6.0, "top_k": 0}
# what the papers' step figures are: AR's forwards / the method's mean forwards per image (SCD Table 1 gives the
# NFE itself), i.e. the bench's `step_compression_total` (all image tokens / all forwards), not the mean of
# per-image ratios (which easy images pull up: 2.60 against 2.25 on the 8 images of
# docs/figures/bench_regime_paper_1126.json)
CALIBRATED_METRIC = "step_compression_total"
# the prompts and seeds the calibration measures on: the bench's 4 default prompts x these seeds
CALIBRATION_SEEDS = (0, 1, 2, 3)


@dataclass(frozen=True)
class Regime:
    """A benchmark regime: the model (a `bench --model` spec), its sampling settings (generate()'s
    cfg_scale, top_k, temperature, top_p; left out: the model's own) and run options every configuration
    that does not set them gets (e.g. reproducible=False)."""

    name: str
    description: str
    model: str
    sampling: dict = field(default_factory=dict)
    run_options: dict = field(default_factory=dict)
    source: str = ""  # where the settings come from (a calibration file, a paper)

    def summary(self) -> str:
        """One line for the bench's stdout: the name, the model and every fixed setting."""
        settings = ", ".join(f"{k}={v}" for k, v in {**self.sampling, **self.run_options}.items())
        settings = settings or "the model's own sampling"
        return f"regime: {self.name} (model {self.model}; {settings}) - {self.description}"

    def as_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "model": self.model,
                "sampling": dict(self.sampling), "run_options": dict(self.run_options), "source": self.source}

    def apply_run_options(self, configs: List[dict]) -> List[dict]:
        """Each configuration with the regime's run options it does not set itself."""
        return [{**{k: v for k, v in self.run_options.items() if k not in cfg}, **cfg} for cfg in configs]


def calibration_path(name: str) -> str:
    return os.path.join(CALIBRATION_DIR, f"regime_{name}.json")


def read_calibration(name: str, path: Optional[str] = None) -> dict:
    """The checked-in result of `calibrate-regime NAME`; a clear error when it is missing or malformed."""
    path = path or calibration_path(name)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"regime {name!r} needs its calibration {path}; run `python -m specar calibrate-regime "
                         f"{name}`") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"regime {name!r}: cannot read its calibration {path}: {e}") from None
    sampling = data.get("sampling") if isinstance(data, dict) else None
    temperature = sampling.get("temperature") if isinstance(sampling, dict) else None
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"regime {name!r}: calibration {path} has no positive sampling.temperature "
                         f"(got {temperature!r}); re-run `python -m specar calibrate-regime {name}`")
    return data


# the demo model's own sampling (model_loaders/weights/demo/config.json), written out so a regime's
# settings are all in its output
DEMO_SAMPLING = {"cfg_scale": 3.0, "top_k": 256, "temperature": 1.0}
FLAT_MODEL = "tiny:8192,16x16,row_end,hidden=64,layers=2,heads=2,scale=1.0"
FLAT_SAMPLING = {"cfg_scale": 3.0, "top_k": 2000, "temperature": 1.0}


def _demo() -> Regime:
    return Regime("demo", "the embedded demo model at its own sampling (sharply peaked targets)", "demo",
                  dict(DEMO_SAMPLING), source="model_loaders/weights/demo/config.json default_sampling")


def _paper() -> Regime:
    cal = read_calibration("paper")
    return Regime("paper", f"the demo model at sampling settings where {PAPER_PROBE.split(',')[0]} commits "
                  f"{cal.get('target', PAPER_TARGET)} tokens per forward as SJD does on Lumina-mGPT (each backend's "
                  "own rejection sampling)", "demo", {**DEMO_SAMPLING, **cal["sampling"]},
                  {"reproducible": False}, source="cli/" + os.path.basename(calibration_path("paper")))


def _flat() -> Regime:
    return Regime("flat", "random-weight target with flat distributions, 8192 codes, 16x16 grid with row ends, "
                  "the papers' Lumina-mGPT sampling; trained backends run random-weight drafters", FLAT_MODEL,
                  dict(FLAT_SAMPLING), source="cli/regimes.py (testing.tiny_model, logit scale 1)")


REGIMES = {"demo": _demo, "paper": _paper, "flat": _flat}  # name -> builder (paper reads its calibration file)


def regime(name: str) -> Regime:
    """The regime `name`; ValueError naming the allowed ones."""
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; regimes: {', '.join(REGIMES)}")
    return REGIMES[name]()


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


__all__ = ["REGIMES", "Regime", "calibrate_temperature", "measure_step_compression", "read_calibration", "regime"]
