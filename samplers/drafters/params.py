"""Typed backend parameters: how a method declares its parameters and itself.

Each method declares, beside its drafter, one frozen dataclass of its parameters whose fields are
made with `param` (default, help, range or choices, the paper's value, whether the field sizes the
draft tree), and one `Method` naming the backend, its label, its drafter class and that dataclass.
samplers/backends.py derives the schema the nodes, the bench and the docs read from these, and
validates a choice once (`make_backend`); the drafter then reads the typed instance's attributes.
"""
from __future__ import annotations

import dataclasses
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
          sizes: bool = False):
    """A dataclass field of a parameter dataclass: its default and, as metadata, everything else."""
    spec = dict(help=help, lo=lo, hi=hi, choices=tuple(choices), paper=paper, folder_of=folder_of, sizes=sizes)
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
class Method:
    """One backend: its name, label and one-line summary, its drafter class and its parameter
    dataclass (whose optional `check()` raises ValueError on values that do not fit together)."""

    name: str
    label: str  # readable name for the UI
    summary: str  # one line: the method and its paper
    params_type: type
    drafter: type  # called as drafter(params, model, sampling)
    paper_preset: tuple = ()  # ((param, value), ...): the paper's setting where our default differs
    lossless: bool = True
    # a trained drafter: its kind in drafter files ("hawk", "eagle", "spatial") and its training
    # function ("module:function" under samplers.drafters), which `train-drafter --kind` runs
    drafter_kind: str = ""
    train: str = ""
