"""The machine a measurement ran on, as every command's JSON records it (figures differ a lot between CPU
models and with other processes' load), and the CPU threads of `demo` and `bench` when `--threads` is not given.

More torch threads than free cores is the worst case on a shared machine: each step waits for the thread
that lost its core (on a 2-core machine at load 6, AR took 19-28 s per image with 2 threads, 1.8-2.4 s
with 1). So the threads are the cores the other processes leave free (1-minute load average), at least
one, at most torch's own default (the physical cores, or OMP_NUM_THREADS when set)."""
from __future__ import annotations

import os
import platform
from typing import Optional


def cpu_name() -> str:
    """The CPU model (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average():
    """The 1, 5 and 15 minute load averages (None on Windows): a busy machine's latencies are longer."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine() -> dict:
    """What a run's JSON records of the machine and the software."""
    import torch
    return {"machine": platform.platform(), "processor": cpu_name(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "load_average": load_average()}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (a container's share)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(given: Optional[int] = None) -> int:
    """`given` when the user gave one, else the cores other processes leave free (at least 1)."""
    if given:
        return given
    import torch
    load = (load_average() or [0.0])[0]
    return max(1, min(torch.get_num_threads(), cores(), int(cores() - load + 0.5)))


def busy_note(threads: int) -> str:
    """"" on a machine with a core for each of our threads, else one line: what the load did to the
    timings and what to do. Read after a run, whose own threads are in the load average."""
    load = (load_average() or [None])[0]
    n = cores()
    if load is None or load < n + 1:  # our threads and the others' fit the cores (within one process's noise)
        return ""
    todo = ("run it again when the machine is idle" if threads == 1 else
            f"run it again with --threads 1 (this run: {threads}) or when the machine is idle")
    return (f"Machine busy (load average {load:.1f} on {n} cores, this run's {threads} threads included): latencies "
            f"are longer than on an idle machine and vary between runs; the speed-up is a ratio within this run and "
            f"holds better. For steadier figures {todo}.")


__all__ = ["busy_note", "choose_threads", "cores", "cpu_name", "load_average", "machine"]
