"""Benchmark regimes (`python -m specar bench --regime NAME`); `python -m specar.tooling calibrate-regime` (the
paper regime's temperature, written to cli/regime_paper.json) is tooling/calibrate_regime.py.

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
  about 2.6 per image in a 16-image scan (its images are simple; scanned 2026-11-27).
- `flat`: a random-weight Llama-style target (`model_loaders/tiny.py`) with flat next-token distributions,
  8192 codes on a 16x16 grid with row ends, sampled as the papers sample Lumina-mGPT (top-k 2000,
  temperature 1, CFG 3). Trained backends (hawk, adt_tree, spatial) run random-weight drafters there.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

CALIBRATION_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Regime:
    """A benchmark regime: the model (a `bench --model` spec), its sampling settings (generate's
    sampling dict: cfg_scale, top_k, temperature, top_p; left out: the model's own) and run options every configuration
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
        raise ValueError(f"regime {name!r} needs its calibration {path}; run `python -m specar.tooling "
                         f"calibrate-regime {name}`") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"regime {name!r}: cannot read its calibration {path}: {e}") from None
    sampling = data.get("sampling") if isinstance(data, dict) else None
    temperature = sampling.get("temperature") if isinstance(sampling, dict) else None
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"regime {name!r}: calibration {path} has no positive sampling.temperature "
                         f"(got {temperature!r}); re-run `python -m specar.tooling calibrate-regime {name}`")
    missing = [k for k in ("probe", "target") if k not in data]
    if missing:
        raise ValueError(f"regime {name!r}: calibration {path} lacks {', '.join(missing)}; re-run "
                         f"`python -m specar.tooling calibrate-regime {name}`")
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
    return Regime("paper", f"the demo model at sampling settings where {cal['probe'].split(',')[0]} commits "
                  f"{cal['target']} tokens per forward as SJD does on Lumina-mGPT (each backend's "
                  "own rejection sampling)", "demo", {**DEMO_SAMPLING, **cal["sampling"]},
                  {"reproducible": False}, source="cli/" + os.path.basename(calibration_path("paper")))


def _flat() -> Regime:
    return Regime("flat", "random-weight target with flat distributions, 8192 codes, 16x16 grid with row ends, "
                  "the papers' Lumina-mGPT sampling; trained backends run random-weight drafters", FLAT_MODEL,
                  dict(FLAT_SAMPLING), source="cli/regimes.py (model_loaders/tiny.py, logit scale 1)")


REGIMES = {"demo": _demo, "paper": _paper, "flat": _flat}  # name -> builder (paper reads its calibration file)


def regime(name: str) -> Regime:
    """The regime `name`; ValueError naming the allowed ones."""
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; regimes: {', '.join(REGIMES)}")
    return REGIMES[name]()
