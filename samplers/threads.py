"""The CPU threads of one generation (`RunOptions(threads=...)`): the user's number, or "auto", the cores other
processes leave free, as `make demo` chooses; torch's global setting restored after the call (ComfyUI's other
nodes share it), and untouched by default.

More torch threads than free cores is the worst case on a shared machine: each step waits for the thread that lost
its core (on a 2-core machine at load 6, AR took 19-28 s per image with 2 threads, 1.8-2.4 s with 1). So "auto" is
the cores the others leave free (1-minute load average), at least one, at most torch's own default (the physical
cores, or OMP_NUM_THREADS when set)."""
from __future__ import annotations

import contextlib
import os
from typing import Optional

import torch


def load_average():
    """The 1, 5 and 15 minute load averages (None on Windows): a busy machine's latencies are longer."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(given: Optional[int] = None) -> int:
    """`given` when the user gave one, else the cores other processes leave free (at least 1)."""
    if given:
        return given
    load = (load_average() or [0.0])[0]
    return max(1, min(torch.get_num_threads(), cores(), int(cores() - load + 0.5)))


@contextlib.contextmanager
def torch_threads(n: Optional[int]):
    """Inside: torch runs `n` CPU threads (None: as it was); torch's setting restored after, even on an error."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
