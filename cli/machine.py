"""The machine a measurement ran on, as every command's JSON records it (figures differ a lot between CPU
models and with other processes' load), and what a busy machine did to a run's timings. The CPU threads of
`demo` and `bench` when `--threads` is not given: samplers/threads.py's `choose_threads` (generate's
``threads="auto"`` too)."""
from __future__ import annotations

import os
import platform

from ..samplers.threads import choose_threads, cores, load_average


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


def machine() -> dict:
    """What a run's JSON records of the machine and the software."""
    import torch
    return {"machine": platform.platform(), "processor": cpu_name(), "cpu_count": os.cpu_count(),
            "torch": torch.__version__, "load_average": load_average()}


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
