"""Backends: one parameter schema per backend, read by validation, the nodes, the docs and the
bench. The drafting itself lives in `samplers/drafters/` (one module per method); a schema names
its drafter class, imported when a generation starts.

To add a backend: write its drafter module, then add a `BackendSchema` to `SCHEMAS` below.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

INITS = ("random", "repeat_left", "repeat_above", "sample_left", "sample_above")
COUPLINGS = ("maximal", "gumbel")
MAX_WINDOW = 128
MAX_TREE_WIDTH = 256  # proactive candidates at one position (the papers use 3-4; the widget's maximum)


@dataclass(frozen=True)
class Param:
    """One backend parameter: default, allowed values, help text and the paper's recommendation."""

    name: str
    default: Any
    help: str
    lo: Optional[float] = None  # numbers: inclusive range (model-dependent limits are checked later)
    hi: Optional[float] = None
    choices: tuple = ()  # strings: the allowed values
    paper: str = ""  # what the method's paper recommends (shown in tooltips and docs)
    folder_of: str = ""  # strings naming a drafter folder: the drafter kind stored there ("hawk", "eagle")

    @property
    def kind(self) -> type:
        return type(self.default)

    def check(self, value):
        """The value if allowed, else a ValueError naming the parameter and what is allowed."""
        n, kind = self.name, self.kind
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{n} must be True or False, got {value!r}")
        elif kind is int:
            hi = "" if self.hi is None else f", {int(self.hi)}"
            if isinstance(value, bool) or not isinstance(value, int) or value < self.lo or \
                    (self.hi is not None and value > self.hi):
                what = f"in [{int(self.lo)}{hi}]" if self.hi is not None else f">= {int(self.lo)}"
                raise ValueError(f"{n} must be an int {what}, got {value!r}")
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                    not self.lo <= value <= self.hi:
                raise ValueError(f"{n} must be a number in [{self.lo:g}, {self.hi:g}], got {value!r}")
            value = float(value)
        elif self.choices:
            if value not in self.choices:
                raise ValueError(f"{n} must be one of {', '.join(self.choices)}; got {value!r}")
        elif not isinstance(value, str):
            raise ValueError(f"{n} must be a string, got {value!r}")
        return value


@dataclass(frozen=True)
class BackendSchema:
    name: str
    label: str  # readable name for the UI
    summary: str  # one line: the method and its paper
    params: tuple = ()
    drafter: str = ""  # "module:Class" under samplers.drafters
    lossless: bool = True
    cross_check: Optional[Callable[[dict], None]] = None  # checks between parameters (ValueError)
    paper_preset: tuple = ()  # ((param, value), ...): the paper's setting where our default differs

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


@dataclass(frozen=True)
class BackendConfig:
    """A validated backend choice: the name and every parameter's value (defaults filled in)."""

    name: str
    values: tuple = ()  # ((param, value), ...) in schema order

    def params(self) -> dict:
        return dict(self.values)

    @property
    def schema(self) -> BackendSchema:
        return SCHEMAS[self.name]

    def make_drafter(self, model, sampling):
        module, cls = self.schema.drafter.split(":")
        return getattr(importlib.import_module(module, __package__), cls)(self, model, sampling)


# ---------------------------------------------------------------------------------------------
# the schemas
WINDOW_HELP = "draft tokens verified per forward (shrinks near the end of the image)"
def _init(default: str, paper: str = "SJD paper: random") -> Param:
    return Param("init", default, "how new window positions are drafted: " + ", ".join(INITS), choices=INITS,
                 paper=paper)


INIT = _init("random")
# sample_above (draft from the distribution recorded one row above) is the fastest lossless init on
# the demo model for scd and auto (docs/BENCHMARKS.md, issue 26); sjd / sjd_pac keep random, the
# default their pinned token tests were recorded with
INIT_ABOVE = _init("sample_above", "SJD paper: random (preset='paper'); sample_above is the fastest on the demo model")


def _restart(default: int) -> Param:
    return Param("restart_after", default, "re-draft the window by `init` after this many steps in a row that "
                 "committed one token each (a coupled Jacobi window stuck in a fixed point); 0: never",
                 lo=0, hi=1024, paper="not in the papers (docs/BENCHMARKS.md: stall restart)")


RESTART = _restart(5)


def _window(default: int, paper: str) -> Param:
    return Param("window", default, WINDOW_HELP, lo=1, hi=MAX_WINDOW, paper=paper)


def _tree_depth_within_window(values: dict) -> None:
    if values["tree_depth"] > values["window"]:
        raise ValueError(f"tree_depth must be an int in [1, {values['window']}], got {values['tree_depth']} (a branch "
                         f"cannot be deeper than the window, {values['window']})")


def _best_first_needs_sampled(values: dict) -> None:
    if values["tree_shape"] == "best_first" and values["candidate_mode"] != "sampled":
        raise ValueError("tree_shape=best_first is a static tree of sampled candidates: it needs candidate_mode=sampled "
                         f"(got candidate_mode={values['candidate_mode']!r})")


SCHEMAS = {}


def register_backend(schema: BackendSchema) -> None:
    SCHEMAS[schema.name] = schema


register_backend(BackendSchema(
    "ar", "AR (baseline)", "plain autoregressive sampling, one token per forward (the baseline)",
    drafter=".drafters.jacobi:JacobiDrafter"))
register_backend(BackendSchema(
    "sjd", "SJD", "Speculative Jacobi Decoding (Teng et al.)",
    params=(_window(16, "SJD paper: 16 (32 and 64 also studied)"), INIT, RESTART),
    drafter=".drafters.jacobi:JacobiDrafter"))
register_backend(BackendSchema(
    "scd", "SCD", "Speculative Jacobi Decoding with coupled re-drafts (So et al.)",
    params=(_window(16, "SCD paper: 16-64"), INIT_ABOVE,
            Param("coupling", "maximal", "how re-drafts are coupled to the previous draft: maximal or gumbel",
                  choices=COUPLINGS, paper="SCD paper: maximal"),
            Param("coupling_strength", 1.0, "alpha: probability of a coupled (vs independent) re-draft", lo=0.0,
                  hi=1.0, paper="SCD paper: 1.0 (0 = plain SJD re-drafting)"), RESTART),
    drafter=".drafters.jacobi:JacobiDrafter", paper_preset=(("init", "random"),)))
register_backend(BackendSchema(
    "sjd_pac", "SJD-PAC", "SJD with proactive drafting and adaptive continuation (Kang et al.)",
    params=(_window(16, "SJD-PAC paper: 64 (preset='paper'); 16 is the fastest on a CPU (docs/BENCHMARKS.md)"),
            Param("tree_depth", 3, "proactive drafting: depth D of the branches after a rejection (at most window)",
                  lo=1, hi=MAX_WINDOW, paper="SJD-PAC paper: D = 3"),
            Param("tree_width", 4, "proactive drafting: candidates K at the first open position (1 = off; at most "
                  "the image vocabulary)", lo=1, hi=MAX_TREE_WIDTH, paper="SJD-PAC paper: K = 4 (the authors' code uses 3)"),
            Param("continuation", True, "adaptive continuation: keep verifying after the first rejection and keep "
                  "passing drafts", paper="SJD-PAC paper: on"),
            INIT,
            Param("coupling", "maximal", "the coupling adaptive continuation uses: maximal (the paper's) or gumbel",
                  choices=COUPLINGS, paper="SJD-PAC paper: maximal"), RESTART),
    drafter=".drafters.jacobi:JacobiDrafter", cross_check=_tree_depth_within_window,
    paper_preset=(("window", 64), ("tree_depth", 3), ("tree_width", 4))))

register_backend(BackendSchema(
    "auto", "Auto", "SCD whose window is chosen every step from this device's measured step "
    "cost and the acceptance seen so far (lossless; docs/BENCHMARKS.md)",
    params=(Param("max_window", 32, "the largest window auto may choose (it picks among AR's single slot and "
                  "windows up to this)", lo=1, hi=MAX_WINDOW),
            Param("cost_model", "measured", "measured: maximise tokens per second on this device (the forward "
                  "timed once per model, then every step); forwards: minimise forward passes (deterministic; "
                  "what a GPU wants)", choices=("measured", "forwards")),
            INIT_ABOVE, RESTART),
    drafter=".drafters.auto:AutoDrafter"))

# -- Hawk (owned by samplers/drafters/hawk.py; adjust only this block) ----------------------------
register_backend(BackendSchema(
    "hawk", "Hawk", "spatial (horizontal + vertical) draft heads with a speculation cache (Chen et al.)",
    params=(Param("horizontal_heads", 2, "horizontal heads: positions T+1..T+n after the pending token", lo=1, hi=16,
                  paper="Hawk paper: Medusa-style heads (preset='paper': 4, our tree of docs/HAWK.md)"),
            Param("vertical_depth", 1, "vertical heads: rows below (T + d * row) kept in the speculation cache", lo=0,
                  hi=4, paper="Hawk paper: VSD"),
            Param("candidates", 2, "candidates drawn from each head's distribution at a position", lo=1, hi=16),
            Param("node_budget", 16, "nodes per forward (pending token included); the tree is padded to it", lo=2,
                  hi=512, paper="preset='paper': 32"),
            Param("vertical_reach", 0, "tree levels past the horizontal heads drafted from the vertical cache alone "
                  "(0: the paper's tree; needs vertical_depth >= 1)", lo=0, hi=64, paper="Hawk paper: 0"),
            Param("chain_prior", 0.6, "tree shape: assumed acceptance of a node's first child (higher: deeper, "
                  "narrower trees within node_budget)", lo=0.05, hi=0.95),
            Param("heads", "", "heads folder; empty: hawk_heads/ beside the model's weights", folder_of="hawk")),
    drafter=".drafters.hawk:HawkDrafter", paper_preset=(("horizontal_heads", 4), ("node_budget", 32))))

# -- ADT-Tree (owned by samplers/drafters/adt_tree.py; adjust only this block) ----------------------
ADT_INITS = ("left", "above", "random")
ADT_CANDIDATE_MODES = ("topk", "sampled")
register_backend(BackendSchema(
    "adt_tree", "ADT-Tree", "EAGLE drafter with adjacency-adaptive dynamic draft trees (Lei et al.)",
    params=(Param("node_budget", 32, "nodes per forward (pending token included); the tree is padded to it", lo=2,
                  hi=512),
            Param("tree_init", "left", "where a new tree's depth and width come from: the left neighbour's tree, the "
                  "one above, or random", choices=ADT_INITS, paper="ADT-Tree paper: left (horizontal)"),
            Param("adaptive", True, "bisection adaptation of depth and width from the previous tree's acceptance "
                  "(off: a fixed EAGLE-2 tree)", paper="ADT-Tree paper: on"),
            Param("beta", 1.0, "acceptance-rate threshold of the adaptation", lo=0.0, hi=1.0, paper="ADT-Tree paper: 1"),
            Param("depth", 5, "initial (or fixed) tree depth d (adaptive: kept in [1, max_depth] and below "
                  "node_budget)", lo=1, hi=64, paper="ADT-Tree paper: d in (0, 10)"),
            Param("width", 8, "initial (or fixed) expansion width k: top-k children per node and nodes expanded per "
                  "layer (adaptive: kept in [4, 13]; at most the image vocabulary)", lo=1, hi=13,
                  paper="ADT-Tree paper: k in (3, 14)"),
            Param("max_depth", 9, "adaptive: the deepest tree the bisection may grow (below node_budget)", lo=1,
                  hi=64, paper="ADT-Tree paper: 9 (d in (0, 10))"),
            Param("candidate_mode", "topk", "how a node's children are chosen: topk (EAGLE-2's deterministic top-k, "
                  "accepted with the target's mass on them) or sampled (drawn without replacement from the drafter's "
                  "q, accepted with about 1 - TV(p, q); tree shape fixed before drawing)", choices=ADT_CANDIDATE_MODES,
                  paper="ADT-Tree paper: topk (EAGLE-2)"),
            Param("children", 2, "sampled mode: siblings drawn per expanded node; each layer expands "
                  "max(1, width // children) nodes (at most the image vocabulary)", lo=1, hi=16),
            Param("root_children", 0, "sampled mode: siblings drawn at the root (depth 1), where a step's first "
                  "draft is rejected most often; 0: `children`. root_children=R, children=1, width=R: R chains",
                  lo=0, hi=16),
            Param("tree_shape", "layers", "sampled trees: layers (`depth` layers of `width` nodes, `children` "
                  "siblings each) or best_first (the best static tree of node_budget - 1 drafts under the acceptance "
                  "guesses below, grown greedily as Sequoia's; ignores depth, width, children; adaptive: each step "
                  "picks from a family of such shapes, deeper after a tree accepted to beta of its depth)",
                  choices=("layers", "best_first")),
            Param("accept_guess", 0.88, "best_first: assumed acceptance of a node's first draw (depth >= 2; "
                  "adaptive: the family's starting shape)",
                  lo=0.01, hi=0.99),
            Param("root_accept_guess", 0.72, "best_first: assumed acceptance of the root's first draw (a step "
                  "starts after a rejection, where drafts fail more)", lo=0.01, hi=0.99),
            Param("sibling_accept_guess", 0.25, "best_first: assumed acceptance of a later sibling once the "
                  "earlier ones failed", lo=0.01, hi=0.99),
            Param("relaxed", False, "LOSSY: LANTERN relaxed acceptance (latent-proximity neighbourhoods); off = lossless",
                  paper="LANTERN: lossy, off by default"),
            Param("relaxed_k", 10, "LANTERN: neighbourhood size k (nearest codes by VQ codebook latent; models "
                  "without a codebook: by image-token embedding)", lo=1, hi=1000, paper="LANTERN: k = 1000 (Anole)"),
            Param("relaxed_delta", 0.1, "LANTERN: total-variation budget delta of the relaxation", lo=0.0, hi=1.0),
            Param("drafter", "", "EAGLE drafter folder; empty: eagle_drafter/ beside the model's weights",
                  folder_of="eagle")),
    drafter=".drafters.adt_tree:ADTTreeDrafter", cross_check=_best_first_needs_sampled))

# -- Spatial (owned by samplers/drafters/spatial/; adjust only this block) -------------------------
register_backend(BackendSchema(
    "spatial", "Spatial", "a Jacobi window over the rows ahead, drafted by trained spatial heads from the rows "
    "above and refined by the target, with proactive branches (issue 27: Hawk + SJD-PAC + SCD)",
    params=(_window(64, "SJD-PAC paper: 64"),
            Param("head_depths", 2, "spatial heads used: a position entering the window is drafted from the "
                  "target's states 1..head_depths rows above it (0: no heads, `init` alone)", lo=0, hi=4,
                  paper="Hawk paper: vertical heads"),
            Param("head_below", 0.2, "a head drafts an entering position only where the draft distribution recorded "
                  "one row above has its largest probability below this (flat regions keep `init`; 1: heads "
                  "wherever they reach)", lo=0.0, hi=1.0),
            Param("init", "sample_above", "how entering positions no head reaches (the first rows) are drafted: "
                  + ", ".join(INITS), choices=INITS, paper="SJD paper: random"),
            # proactive drafting and adaptive continuation: SJD-PAC's parameters
            *(SCHEMAS["sjd_pac"].param(n) for n in ("tree_depth", "tree_width", "continuation", "coupling",
                                                     "restart_after")),
            Param("heads", "", "spatial heads folder; empty: spatial_heads/ beside the model's weights",
                  folder_of="spatial")),
    drafter=".drafters.spatial.drafter:SpatialDrafter", cross_check=_tree_depth_within_window))


def _installed(schema: BackendSchema) -> bool:
    """A backend is offered only when its drafter module is part of this installation."""
    import importlib.util
    module = schema.drafter.split(":")[0]
    return importlib.util.find_spec(module, __package__) is not None


for _name in [n for n, s in SCHEMAS.items() if not _installed(s)]:
    del SCHEMAS[_name]
BACKENDS = tuple(SCHEMAS)
# name -> {param: (default, help)}: the compact view older code and the nodes read
BACKEND_PARAMS = {name: {p.name: (p.default, p.help) for p in s.params} for name, s in SCHEMAS.items()}
PARAM_CHOICES = {p.name: p.choices for s in SCHEMAS.values() for p in s.params if p.choices}
PARAM_RANGES = {p.name: (p.lo, p.hi) for s in SCHEMAS.values() for p in s.params if p.lo is not None}
PAPER_NOTES = {}
for _s in SCHEMAS.values():
    for _p in _s.params:
        if _p.paper and _p.paper not in PAPER_NOTES.get(_p.name, ""):
            PAPER_NOTES[_p.name] = "; ".join(filter(None, [PAPER_NOTES.get(_p.name), _p.paper]))


PRESETS = ("default", "paper")


def make_backend(name: str, preset: str = "default", **params) -> BackendConfig:
    """Validate a backend name and its parameters; ValueError names the bad one and what is allowed.
    ``preset="paper"``: start from the method paper's setting (where our default, the fastest
    lossless setting measured on the demo model, differs); explicit parameters still win."""
    if name not in SCHEMAS:
        raise ValueError(f"backend must be one of {', '.join(SCHEMAS)}; got {name!r}")
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    schema = SCHEMAS[name]
    if preset == "paper":
        params = {**dict(schema.paper_preset), **params}
    allowed = [p.name for p in schema.params]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"backend {name!r} has no parameter {', '.join(unknown)}; "
                         f"its parameters are: {', '.join(allowed) or '(none)'}")
    values = {p.name: p.check(params.get(p.name, p.default)) for p in schema.params}
    if schema.cross_check is not None:
        schema.cross_check(values)
    return BackendConfig(name, tuple(values.items()))
