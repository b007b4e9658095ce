"""Backends: the registry of drafting methods and the one validation of a backend choice.

Each method declares its typed parameter dataclass and its `Method` beside its drafter
(samplers/drafters/); this module derives from them the schema the nodes, the docs and the bench
read (`SCHEMAS`), and `make_backend` validates a choice once, into a `BackendConfig` whose `params`
is the method's typed dataclass instance: the drafter reads its attributes.

To add a backend: write its drafter module (parameters, drafter, `Method`), then add its `Method`
to `METHODS` below (one line).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .drafters import adt_tree, ar, auto, hawk, jacobi
from .drafters.params import COUPLINGS, INITS, MAX_TREE_WIDTH, MAX_WINDOW, Method, Param, declared_params
from .drafters.spatial import drafter as spatial

METHODS = (ar.AR, jacobi.SJD, jacobi.SCD, jacobi.SJD_PAC, auto.AUTO, hawk.HAWK, adt_tree.ADT_TREE, spatial.SPATIAL)


@dataclass(frozen=True)
class BackendSchema:
    """What the nodes, the docs and the bench read of a backend: derived from its `Method`."""

    name: str
    label: str  # readable name for the UI
    summary: str  # one line: the method and its paper
    params: tuple = ()  # Param of each field of the parameter dataclass, in order
    drafter: Optional[type] = None  # called as drafter(typed params, model, sampling)
    lossless: bool = True
    cross_check: Optional[Callable[[Any], None]] = None  # checks between parameters of a typed instance (ValueError)
    paper_preset: tuple = ()  # ((param, value), ...): the paper's setting where our default differs
    params_type: Optional[type] = None  # the frozen parameter dataclass (None: one is made from `params`)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    @property
    def size_params(self) -> tuple:
        """The names of the parameters that size the draft tree (slots per forward)."""
        return tuple(p.name for p in self.params if p.sizes)

    def typed(self) -> type:
        """The parameter dataclass (one made from `params` for a schema declared without one)."""
        return self.params_type or dataclasses.make_dataclass(
            f"{self.name}_params", [(p.name, p.kind, dataclasses.field(default=p.default)) for p in self.params],
            frozen=True)


def schema_of(method: Method) -> BackendSchema:
    return BackendSchema(method.name, method.label, method.summary, params=declared_params(method.params_type),
                         drafter=method.drafter, lossless=method.lossless,
                         cross_check=getattr(method.params_type, "check", None), paper_preset=method.paper_preset,
                         params_type=method.params_type)


@dataclass(frozen=True)
class BackendConfig:
    """A validated backend choice: the name and the method's typed parameters (defaults filled in)."""

    name: str
    typed_params: Any  # the method's frozen parameter dataclass instance

    def params(self) -> dict:
        """The values by name, in schema order (stats, the nodes' generate call)."""
        return {f.name: getattr(self.typed_params, f.name) for f in dataclasses.fields(self.typed_params)}

    @property
    def schema(self) -> BackendSchema:
        return SCHEMAS[self.name]

    def make_drafter(self, model, sampling):
        return self.schema.drafter(self.typed_params, model, sampling)


SCHEMAS = {}


def register_backend(schema: BackendSchema) -> None:
    SCHEMAS[schema.name] = schema


for _method in METHODS:
    register_backend(schema_of(_method))
BACKENDS = tuple(SCHEMAS)

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
    typed = schema.typed()(**{p.name: p.check(params[p.name]) for p in schema.params if p.name in params})
    if schema.cross_check is not None:
        schema.cross_check(typed)
    return BackendConfig(name, typed)


__all__ = ["BACKENDS", "COUPLINGS", "INITS", "MAX_TREE_WIDTH", "MAX_WINDOW", "METHODS", "PRESETS",
           "SCHEMAS", "BackendConfig", "BackendSchema", "Param", "make_backend", "register_backend", "schema_of"]
