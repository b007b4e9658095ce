"""The backends as the command line reads them: the registry itself (samplers/backends.py, which imports no torch),
so a command checks a `backend[:key=value,...]` argument in well under a second, before torch is imported."""
from __future__ import annotations

from ..samplers import backends

RUN_KEYS = ("compile", "reproducible")  # RunOptions fields a configuration may set beside the backend's parameters
DOCS_URL = "https://github.com/specar/specar/blob/main/docs"  # pyproject's [project.urls] Documentation


def drafter_kinds() -> dict:
    """kind -> the Method whose trained drafter it is (`train-drafter --kind`)."""
    return {m.drafter_kind: m for m in backends.SCHEMAS.values() if m.train}


def parse_config(text: str) -> dict:
    """'sjd_pac:window=64,tree_width=4' -> {'backend': 'sjd_pac', 'window': 64, 'tree_width': 4}; ValueError naming
    the bad part and what is allowed (make_backend's message, with the argument it came from)."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in backends.SCHEMAS:
        where = f" in {text!r}" if rest else ""
        raise ValueError(f"unknown backend {name!r}{where}; backends: {', '.join(backends.SCHEMAS)}")
    declared, out = {p.name: p for p in backends.SCHEMAS[name].params}, {"backend": name}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"expected key=value in {text!r}, got {item!r}")
        kind = bool if key in RUN_KEYS else declared[key].kind if key in declared else str
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key} must be true or false in {text!r}, got {value!r}")
            out[key] = value.lower() in ("true", "1")
            continue
        try:
            out[key] = kind(value) if kind in (int, float) else value
        except ValueError:
            out[key] = value  # the parameter's check names its type and range
    try:
        checked = backends.make_backend(name, **{k: v for k, v in out.items() if k not in RUN_KEYS and k != "backend"})
    except ValueError as e:
        extra = f", and {' / '.join(RUN_KEYS)} / preset" if "has no parameter" in str(e) else ""
        raise ValueError(f"{e}{extra} (in {text!r})") from None
    return {**out, **{k: v for k, v in checked.params().items() if k in out}}


def generate_args(config: dict, **options) -> dict:
    """A `parse_config` configuration as generate's backend= (`make_backend`) and options= (with `options`)."""
    params = {k: v for k, v in config.items() if k not in RUN_KEYS and k != "backend"}
    return dict(backend=backends.make_backend(config["backend"], **params),
                options={**{k: config[k] for k in RUN_KEYS if k in config}, **options})
