"""The backends as the command line needs them before torch is imported: their names, the default backend, each
parameter's type and allowed values, the bench's default configurations and the drafter kinds, read from
cli/backends.json, a snapshot of the registry (samplers/backends.py) that tests/test_cli_fast.py keeps equal to it
(`python -m specar.cli.schema` rewrites it). A command checks its arguments here in well under a second; the
registry's own checks (make_backend's cross-checks) run again once torch is loaded."""
from __future__ import annotations

import json
import os
import sys

from ..samplers.drafters.params import Param

SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends.json")
RUN_KEYS = ("compile", "reproducible")  # generate() options a configuration may set beside the backend's parameters
PARAM_FIELDS = ("name", "default", "lo", "hi", "choices")
DOCS_URL = "https://github.com/specar/specar/blob/main/docs"  # pyproject's [project.urls] Documentation


def _load() -> dict:
    with open(SNAPSHOT, encoding="utf-8") as f:
        return json.load(f)


_DATA = _load()
DEFAULT_BACKEND: str = _DATA["default_backend"]
BACKENDS: tuple = tuple(_DATA["backends"])
BENCH_CONFIGS: list = list(_DATA["bench_configs"])
DRAFTER_KINDS: dict = dict(_DATA["drafter_kinds"])  # kind -> {"backend", "label", "train": "module:function"}


def _current() -> dict:
    """The registry itself once it is imported (torch loaded: exact, a backend added at run time included), else
    the snapshot."""
    return snapshot() if f"{__package__.rpartition('.')[0]}.samplers.backends" in sys.modules else _DATA


def params(backend: str) -> dict:
    return {p["name"]: Param(help="", **{k: tuple(v) if k == "choices" else v for k, v in p.items()})
            for p in _current()["backends"][backend]["params"]}


def parse_config(text: str) -> dict:
    """'sjd_pac:window=64,tree_width=4' -> {'backend': 'sjd_pac', 'window': 64, 'tree_width': 4}; ValueError naming
    the bad part and what is allowed (the name, the key, the value's type and range)."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in _current()["backends"]:
        where = f" in {text!r}" if rest else ""
        raise ValueError(f"unknown backend {name!r}{where}; backends: {', '.join(_current()['backends'])}")
    declared, out = params(name), {"backend": name}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"expected key=value in {text!r}, got {item!r}")
        if key == "preset":  # make_backend's: the method paper's settings under the explicit ones
            presets = _current()["presets"]
            if value not in presets:
                raise ValueError(f"preset must be one of {', '.join(presets)}; got {value!r} (in {text!r})")
            out[key] = value
            continue
        if key not in declared and key not in RUN_KEYS:
            raise ValueError(f"backend {name!r} has no parameter {key} (in {text!r}); its parameters are: "
                             f"{', '.join(declared) or '(none)'}, and {' / '.join(RUN_KEYS)} / preset")
        kind = bool if key in RUN_KEYS else declared[key].kind
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key} must be true or false in {text!r}, got {value!r}")
            out[key] = value.lower() in ("true", "1")
            continue
        try:
            typed = kind(value) if kind in (int, float) else value
        except ValueError:
            typed = value  # the parameter's check names its type and range
        try:
            out[key] = declared[key].check(typed)
        except ValueError as e:
            raise ValueError(f"{e} (in {text!r})") from None
    return out


def snapshot() -> dict:
    """What cli/backends.json holds, from the registry (imports torch)."""
    from ..samplers.backends import DEFAULT_BACKEND as default, METHODS, PRESETS, bench_configs

    def plain(p):
        return {k: list(getattr(p, k)) if k == "choices" else getattr(p, k) for k in PARAM_FIELDS}

    return {"default_backend": default, "bench_configs": bench_configs(), "presets": list(PRESETS),
            "backends": {m.name: {"label": m.label, "params": [plain(p) for p in m.params]} for m in METHODS},
            "drafter_kinds": {m.drafter_kind: {"backend": m.name, "label": m.label, "train": m.train}
                              for m in METHODS if m.train}}


if __name__ == "__main__":
    with open(SNAPSHOT, "w", encoding="utf-8") as f:
        json.dump(snapshot(), f, indent=1)
        f.write("\n")
    sys.exit(0)
