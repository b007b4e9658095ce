"""Typed backend parameters: how a method declares its parameters (a frozen dataclass of `param` fields) and itself
(`Method`), beside its drafter; samplers/backends.py derives the schema from these and validates a choice once
(docs/ARCHITECTURE.md, "Registry of backends")."""
from __future__ import annotations

import dataclasses
import functools
import importlib
import math
from dataclasses import dataclass
from typing import Any, Optional

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
    # "module:Class", called as Class(params, model, sampling) and imported on first use (declaring a method imports
    # no torch); a module starting with "." is under samplers/drafters/
    drafter: str
    paper_preset: tuple = ()  # ((param, value), ...): the paper's setting where our default differs
    lossless: bool = True
    # a trained drafter: its kind in drafter files ("hawk", "eagle", "spatial") and its training
    # function ("module:function" under training/, which owns training: samplers/ never imports it),
    # which `train-drafter --kind` runs
    drafter_kind: str = ""
    train: str = ""
    # the bench's default run (`python -m specar bench`) beyond the method's defaults: more settings,
    # 'key=value,...' (e.g. the paper's ablation)
    bench_variants: tuple = ()
    experimental: bool = False  # not ahead in any measured time yet: out of bench's default run, listed last, labelled

    @functools.cached_property
    def drafter_class(self) -> type:
        module, _, name = self.drafter.partition(":")
        return getattr(importlib.import_module(module, __package__ if module.startswith(".") else None), name)

    @functools.cached_property
    def params(self) -> tuple:
        """`Param` of each field of the parameter dataclass, in order."""
        return tuple(Param(f.name, f.default, **f.metadata["param"]) for f in dataclasses.fields(self.params_type))

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

    def bench_configs(self) -> tuple:
        """This method's configurations in the bench's default run: its defaults, then its variants."""
        return () if self.experimental else (self.name,) + tuple(f"{self.name}:{v}" for v in self.bench_variants)
