"""Test cases written as one flat dict of settings (a backend and its parameters, sampling and run settings,
generate's own keywords, as parametrized cases and the registry's pinned settings are) spelled as generate's
keywords."""
from dataclasses import fields

from specar import RunOptions, SamplingParams, make_backend
from specar.samplers.backends import DEFAULT_BACKEND

OWN = ("seed", "sampling", "negative_prompt", "batch_size", "images", "progress", "interrupt", "options")


def generate_kwargs(**settings) -> dict:
    """`settings` as generate's keywords: `backend=make_backend(name, **its parameters)` (a name alone, or a
    validated backend, as it is), `sampling=` and `options=` dicts of the sampling and run settings."""
    out = {k: settings.pop(k) for k in OWN if k in settings}
    for name, kind in (("sampling", SamplingParams), ("options", RunOptions)):
        given = {f.name: settings.pop(f.name) for f in fields(kind) if f.name in settings}
        if given:
            out[name] = {**(out.get(name) or {}), **given}
    backend = settings.pop("backend", DEFAULT_BACKEND)
    out["backend"] = make_backend(backend, **settings) if settings else backend
    return out
