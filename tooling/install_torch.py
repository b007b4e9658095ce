"""Install torch into a Python that has none, from the right index, saying which (the Makefile's `demo` runs it).

    python tooling/install_torch.py PYTHON [TORCH_SPEC]

- TORCH_INDEX=<url>: that index.
- TORCH_CUDA=1: pip's configured index (PyPI by default: the CUDA build on Linux x86_64, about 2.5 GB with its NVIDIA
  libraries).
- otherwise, on Linux without an NVIDIA driver (no /proc/driver/nvidia, no nvidia-smi): PyTorch's CPU index (about
  200 MB), or pip's configured index when that one cannot be reached (a machine with a local mirror only);
  elsewhere pip's configured index.
Nothing is done when PYTHON already imports torch.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_nvidia() -> bool:
    return os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi") is not None


def reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        urllib.request.urlopen(url + "/torch/", timeout=timeout).close()
        return True
    except Exception:
        return False


def choose_index(env=os.environ, platform: str = sys.platform, nvidia=has_nvidia, reach=reachable) -> tuple:
    """(index URL or None for pip's configured one, the sentence that says why)."""
    if env.get("TORCH_INDEX"):
        return env["TORCH_INDEX"], f"from TORCH_INDEX={env['TORCH_INDEX']}"
    if env.get("TORCH_CUDA"):
        return None, ("TORCH_CUDA is set: from pip's configured index (PyPI: the CUDA build on Linux, about 2.5 GB "
                      "with its NVIDIA libraries)")
    if not platform.startswith("linux"):
        return None, "from pip's configured index"
    if nvidia():
        return None, ("an NVIDIA driver is present: from pip's configured index (PyPI: the CUDA build, about 2.5 GB "
                      "with its NVIDIA libraries; TORCH_INDEX=<url> for another)")
    if reach(CPU_INDEX):
        return CPU_INDEX, (f"no NVIDIA GPU found (no /proc/driver/nvidia, no nvidia-smi): the CPU build from "
                           f"{CPU_INDEX}, about 200 MB (TORCH_CUDA=1 takes the CUDA build)")
    return None, (f"no NVIDIA GPU found, and {CPU_INDEX} cannot be reached: from pip's configured index "
                  f"(TORCH_INDEX=<url> for another)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    python, spec = argv[0], (argv[1] if len(argv) > 1 else "torch")
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        return 0
    index, why = choose_index()
    print(f"Installing {spec}: {why}. pip's progress below.", flush=True)
    cmd = [python, "-m", "pip", "install", "--progress-bar", "on", spec]
    if index:
        cmd += ["--index-url", index]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
