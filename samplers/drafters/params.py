"""Typed backend parameters: how a method declares its parameters and itself.

Each method declares, beside its drafter, one frozen dataclass of its parameters whose fields are
made with `param` (default, help, range or choices, the paper's value, whether the field sizes the
draft tree), and one `Method` naming the backend, its label, its drafter class and that dataclass.
samplers/backends.py derives the schema the nodes, the bench and the docs read from these, and
validates a choice once (`make_backend`); the drafter then reads the typed instance's attributes.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
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
    sizes: bool = False  # the value sets the draft tree's size (slots per forward): named on out-of-memory
    essential: bool = False  # shown first on the sampler node (the others are advanced inputs, shown on request)
    # choices that need another parameter's value: ((value, ((other parameter, its value), ...)), ...); the
    # sampler node's web extension sets the other parameter when this one is set to the value
    implies: tuple = ()

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


def param(default, help: str, *, lo=None, hi=None, choices: tuple = (), paper: str = "", folder_of: str = "",
          sizes: bool = False, essential: bool = False, implies=()):
    """A dataclass field of a parameter dataclass: its default and, as metadata, everything else.
    ``implies``: {value: {other parameter: value}} (or its pairs), see `Param.implies`."""
    if isinstance(implies, dict):
        implies = tuple((v, tuple(dict(forced).items())) for v, forced in implies.items())
    spec = dict(help=help, lo=lo, hi=hi, choices=tuple(choices), paper=paper, folder_of=folder_of, sizes=sizes,
                essential=essential, implies=tuple(implies))
    return dataclasses.field(default=default, metadata={"param": spec})


def same_param(params_type: type, name: str, **changes):
    """Another method's field, reused (e.g. spatial's proactive drafting is SJD-PAC's), with `changes`."""
    f = next(f for f in dataclasses.fields(params_type) if f.name == name)
    spec = {**f.metadata["param"], **{k: v for k, v in changes.items() if k != "default"}}
    return param(changes.get("default", f.default), **spec)


def declared_params(params_type: type) -> tuple:
    """The `Param` of every field of a parameter dataclass, in field order."""
    return tuple(Param(f.name, f.default, **f.metadata["param"]) for f in dataclasses.fields(params_type))


@dataclass(frozen=True)
class DraftNetworkCost:
    """A drafter network run before each verify forward, in a projection's terms (tooling/roofline.py)."""

    calls: int  # calls per step (EAGLE: one per tree layer; heads: one)
    tokens: int  # tokens per image row of each call
    layers: int = 0  # decoder layers of the target's width (EAGLE: 1; draft heads: 0)
    head_blocks: int = 0  # residual SiLU blocks of the target's width (Hawk / spatial heads)
    band: int = 0  # committed positions the drafter's layer attends to


@dataclass(frozen=True)
class StepCost:
    """The shape of a backend's decode step, for projecting its cost onto another model and device
    (tooling/roofline.py): tokens per image row of each verify forward, with the share of steps at each size
    (a backend whose window changes has several), and the drafter network run before it."""

    tokens: tuple  # ((tokens per image row, share of steps), ...)
    network: Optional[DraftNetworkCost] = None


def chain_tokens(window: int, row_codes: int) -> int:
    """Tokens per image row of a Jacobi-family forward on an image whose rows hold `row_codes` codes, each
    row followed by a forced row end: the pending token, `window` drafts and the row ends among them."""
    return 1 + window + window // row_codes


@dataclass(frozen=True)
class Method:
    """One backend: its name, label and one-line description, its drafter class and its parameter
    dataclass (whose optional `check()` raises ValueError on values that do not fit together).
    It is also the backend's schema, which the nodes, the docs and the bench read (`params`,
    `size_params`, ...: derived from the parameter dataclass)."""

    name: str
    label: str  # readable name for the UI
    description: str  # one line: the method and its paper
    params_type: type
    drafter: type  # called as drafter(params, model, sampling)
    paper_preset: tuple = ()  # ((param, value), ...): the paper's setting where our default differs
    lossless: bool = True
    # a trained drafter: its kind in drafter files ("hawk", "eagle", "spatial") and its training
    # function ("module:function" under training/, which owns training: samplers/ never imports it),
    # which `train-drafter --kind` runs
    drafter_kind: str = ""
    train: str = ""
    # its step's shape for a projection (tooling/roofline.py): (parameter values by name as a `bench --json` row
    # records them, codes per image row, the backend reports of the row's generations) -> StepCost; a value
    # the row lacks is a KeyError (the projection names it)
    step_cost: Optional[Callable[[dict, int, list], StepCost]] = None
    # the bench's default run (`python -m specar bench`) beyond the method's defaults: more settings,
    # 'key=value,...' (e.g. the paper's ablation)
    bench_variants: tuple = ()
    experimental: bool = False  # not ahead in any measured time yet: out of bench's default run, listed last, labelled

    @functools.cached_property
    def params(self) -> tuple:
        """`Param` of each field of the parameter dataclass, in order."""
        return declared_params(self.params_type)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    @property
    def size_params(self) -> tuple:
        """The names of the parameters that size the draft tree (slots per forward)."""
        return tuple(p.name for p in self.params if p.sizes)

    @property
    def essential_params(self) -> tuple:
        """The names of the inputs the sampler node shows first (none declared: every input is)."""
        return tuple(p.name for p in self.params if p.essential) or tuple(p.name for p in self.params)

    def cross_check(self, typed) -> None:
        """The checks between parameters of a typed instance (the dataclass's optional `check()`): ValueError."""
        check = getattr(typed, "check", None)
        if check is not None:
            check()

    def bench_configs(self) -> tuple:
        """This method's configurations in the bench's default run: its defaults, then its variants."""
        return () if self.experimental else (self.name,) + tuple(f"{self.name}:{v}" for v in self.bench_variants)
