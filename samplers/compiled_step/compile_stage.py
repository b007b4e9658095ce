"""Who hears that a step shape is about to be compiled (its first use: seconds to minutes, the step's progress
stands still meanwhile): `listening(fn)` around a generation, `starting(what)` where the compile begins.
The ComfyUI sampler shows it as a stage of the run; a call from Python with nobody listening gets one log line, the
first time, so a silent minute is not taken for a hang."""
from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Callable, Optional

_listener: contextvars.ContextVar[Optional[Callable[[str], None]]] = contextvars.ContextVar("specar_compile_listener",
                                                                                           default=None)
_announced: list = []  # the first compile this process announced by a log line (one line per process)


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
    elif not _announced:
        _announced.append(what)
        # a warning: Python's default logging shows it without any set-up
        logging.getLogger("specar").warning(
            "specar: compile=True compiles the %s for each new step shape on its first use: tens of seconds to a few "
            "minutes, with no progress meanwhile; later calls reuse the compiled shapes", what)


__all__ = ["listening", "starting"]
