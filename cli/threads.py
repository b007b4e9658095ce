"""The CPU threads of `demo` and `bench` when `--threads` is not given, and their note on a busy machine.

More torch threads than free cores is the worst case on a shared machine: each step waits for the thread
that lost its core (on a 2-core machine at load 6, AR took 19-28 s per image with 2 threads, 1.8-2.4 s
with 1). So the threads are the cores the other processes leave free (1-minute load average), at least
one, at most torch's own default (the physical cores, or OMP_NUM_THREADS when set).
"""
from __future__ import annotations

import os
from typing import Optional


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> Optional[float]:
    """The 1-minute load average (None on Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows: no load average
        return None


def choose_threads(given: Optional[int] = None) -> int:
    """`given` when the user gave one, else the cores other processes leave free (at least 1)."""
    if given:
        return given
    import torch
    load = load_average() or 0.0
    return max(1, min(torch.get_num_threads(), cores(), int(cores() - load + 0.5)))


def busy_note(threads: int) -> str:
    """"" on a machine with a core for each of our threads, else one line: what the load did to the
    timings and what to do. Read after a run, whose own threads are in the load average."""
    load = load_average()
    n = cores()
    if load is None or load < n + 1:  # our threads and the others' fit the cores (within one process's noise)
        return ""
    todo = ("run it again when the machine is idle" if threads == 1 else
            f"run it again with --threads 1 (this run: {threads}) or when the machine is idle")
    return (f"Machine busy (load average {load:.1f} on {n} cores, this run's {threads} threads included): latencies "
            f"are longer than on an idle machine and vary between runs; the speed-up is a ratio within this run and "
            f"holds better. For steadier figures {todo}.")


__all__ = ["busy_note", "choose_threads", "cores", "load_average"]
