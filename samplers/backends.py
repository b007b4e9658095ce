"""Backends: what each method drafts. The engine (engine.py) does everything else.

A backend answers three questions the engine asks every step:
- ``window``: how many image-token drafts follow the pending token in one forward;
- ``init``: how a position that enters the window for the first time is drafted (and with which q);
- ``refine``: how a position that was drafted but not reached by verification is re-drafted for
  the next step, from the new (stale-context) p computed at it: an independent sample (SJD), the
  maximal coupling of the old draft with the new p, or Gumbel coupling (SCD).

Parameter names are shared with the ComfyUI node widgets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

INITS = ("random", "repeat_left", "repeat_above", "sample_left", "sample_above")
COUPLINGS = ("maximal", "gumbel")
MAX_WINDOW = 128

# name -> {param: (default, description)}; the single source for docs, nodes and validation
BACKEND_PARAMS = {
    "ar": {},
    "sjd": {
        "window": (16, "draft tokens verified per forward (1..128; shrinks near the end of the image)"),
        "init": ("random", "how new window positions are drafted: " + ", ".join(INITS)),
    },
    "scd": {
        "window": (16, "draft tokens verified per forward (1..128)"),
        "init": ("random", "how new window positions are drafted: " + ", ".join(INITS)),
        "coupling": ("maximal", "how re-drafts are coupled to the previous draft: maximal or gumbel"),
        "coupling_strength": (1.0, "alpha in [0, 1]: probability of a coupled (vs independent) re-draft"),
    },
    "sjd_pac": {
        "window": (64, "draft tokens of the main chain per forward (1..128)"),
        "tree_depth": (3, "proactive drafting: depth D of the branches after a rejection (1..window)"),
        "tree_width": (4, "proactive drafting: candidates K at the first open position (1 = off; at most the image vocabulary)"),
        "continuation": (True, "adaptive continuation: keep verifying after the first rejection and keep passing drafts"),
        "init": ("random", "how new window positions are drafted: " + ", ".join(INITS)),
        "coupling": ("maximal", "the coupling adaptive continuation uses: maximal (the paper's) or gumbel"),
    },
}
BACKENDS = tuple(BACKEND_PARAMS)


@dataclass(frozen=True)
class Backend:
    name: str
    window: int = 0
    init: str = "random"
    refine: str = "independent"  # independent | maximal | gumbel
    coupling_strength: float = 0.0
    tree_width: int = 1  # K: candidates at the first open position after a rejection (1: chain only)
    tree_depth: int = 1  # D: depth of each extra branch
    coupling: str = ""  # as given by the user (sjd_pac keeps it even with continuation off)

    def params(self) -> dict:
        keys = BACKEND_PARAMS[self.name]
        full = {"window": self.window, "init": self.init, "coupling": self.coupling or self.refine,
                "coupling_strength": self.coupling_strength, "tree_depth": self.tree_depth,
                "tree_width": self.tree_width, "continuation": self.refine != "independent"}
        return {k: full[k] for k in keys}


def _check_int(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    return value


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def make_backend(name: str, **params) -> Backend:
    """Validate a backend name and its parameters; ValueError names the bad one and what is allowed."""
    if name not in BACKEND_PARAMS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    allowed = BACKEND_PARAMS[name]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"backend {name!r} has no parameter {', '.join(unknown)}; "
                         f"its parameters are: {', '.join(allowed) or '(none)'}")
    p = {k: params.get(k, default) for k, (default, _) in allowed.items()}
    if name == "ar":
        return Backend("ar")
    window = _check_int("window", p["window"], 1, MAX_WINDOW)
    init = _check_choice("init", p["init"], INITS)
    if name == "sjd":
        return Backend("sjd", window=window, init=init)
    coupling = _check_choice("coupling", p["coupling"], COUPLINGS)
    if name == "sjd_pac":
        depth = _check_int("tree_depth", p["tree_depth"], 1, window)
        width = p["tree_width"]
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"tree_width must be an int >= 1 (at most the image vocabulary), got {width!r}")
        cont = p["continuation"]
        if not isinstance(cont, bool):
            raise ValueError(f"continuation must be True or False, got {cont!r}")
        return Backend("sjd_pac", window=window, init=init, refine=coupling if cont else "independent",
                       coupling_strength=1.0, tree_width=width, tree_depth=depth, coupling=coupling)
    a = p["coupling_strength"]
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or not 0.0 <= a <= 1.0:
        raise ValueError(f"coupling_strength must be a number in [0, 1], got {a!r}")
    return Backend("scd", window=window, init=init, refine=coupling, coupling_strength=float(a))
