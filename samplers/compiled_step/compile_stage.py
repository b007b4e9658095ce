"""Who hears that a step shape is about to be compiled (its first use: seconds to minutes, the step's progress
stands still meanwhile): `listening(fn)` around a generation, `starting(what)` where the compile begins.
The ComfyUI sampler shows it as a stage of the run."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Optional

_listener: contextvars.ContextVar[Optional[Callable[[str], None]]] = contextvars.ContextVar("specar_compile_listener",
                                                                                           default=None)


@contextlib.contextmanager
def listening(fn: Optional[Callable[[str], None]]):
    token = _listener.set(fn)
    try:
        yield
    finally:
        _listener.reset(token)


def starting(what: str) -> None:
    """Called before the first call of a new shape (which compiles it, or loads it from the disk cache)."""
    fn = _listener.get()
    if fn is not None:
        fn(what)


__all__ = ["listening", "starting"]
