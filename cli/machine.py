"""The machine a measurement ran on, as every command's JSON records it: figures differ a lot between CPU
models and with other processes' load."""
from __future__ import annotations

import os
import platform


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


__all__ = ["cpu_name", "load_average", "machine"]
