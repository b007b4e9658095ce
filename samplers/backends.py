"""Backends: the registry of drafting methods (`METHODS`, `SCHEMAS`: name -> the `Method` the nodes, docs and bench
read) and the one validation of a backend choice (`make_backend` -> `BackendConfig`, whose `typed_params` the drafter
reads). Adding a backend is its package plus one line in `METHODS`: docs/ARCHITECTURE.md, "Registry of backends"."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .drafters import adt_tree, auto, hawk, jacobi, spatial
from .drafters.params import COUPLINGS, INITS, MAX_TREE_WIDTH, MAX_WINDOW, Method, Param

METHODS = (jacobi.AR, jacobi.SJD, jacobi.SCD, jacobi.SJD_PAC, auto.AUTO, hawk.HAWK, adt_tree.ADT_TREE, spatial.SPATIAL)


@dataclass(frozen=True)
class BackendConfig:
    """A validated backend choice: the name and the method's typed parameters (defaults filled in)."""

    name: str
    typed_params: Any  # the method's frozen parameter dataclass instance

    def params(self) -> dict:
        """The values by name, in schema order (stats, the nodes' generate call)."""
        return {f.name: getattr(self.typed_params, f.name) for f in dataclasses.fields(self.typed_params)}

    @property
    def schema(self) -> Method:
        return SCHEMAS[self.name]

    def verify_width(self, model) -> int:
        """Tokens of this backend's widest target forward on `model`, pending token included: the width of a
        shape-pinned generation (`RunOptions(pin_width=)`; AR padded to it gives this backend's tokens)."""
        from .target import SamplingParams
        return self.make_drafter(model, SamplingParams()).node_budget

    def make_drafter(self, model, sampling):
        return self.schema.drafter_class(self.typed_params, model, sampling)


SCHEMAS = {m.name: m for m in METHODS}  # name -> Method: what the nodes, the docs and the bench read
BACKENDS = tuple(SCHEMAS)
# the one default of the API, the node, `bench` and `demo`: auto picks its window per step from the step costs it
# measures on the machine it runs on, so one default suits a CPU and a GPU
DEFAULT_BACKEND = "auto"


def bench_configs() -> list:
    """The bench's default run: each method's defaults, then its variants (experimental ones only when named)."""
    return [c for m in SCHEMAS.values() for c in m.bench_configs()]


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
    typed = schema.params_type(**{p.name: p.check(params[p.name]) for p in schema.params if p.name in params})
    getattr(typed, "check", lambda: None)()  # the checks between parameters (the dataclass's optional check())
    return BackendConfig(name, typed)
