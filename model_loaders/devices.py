"""The device and dtype a model loads on: checked once, with a message naming the value and the choices."""
from __future__ import annotations

import torch

# dtype names load_model takes -> the torch dtype name; None / "auto": the model's choice
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16", "half": "float16"}


def canonical_dtype(dtype):
    """None for None / "auto", else "float32", "bfloat16" or "float16" (from a name, an alias or a torch
    dtype); ValueError naming the value and the choices for anything else."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).replace("torch.", "")
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16 (or bf16, fp16, fp32), got {dtype!r}")


def check_device(device) -> None:
    """ValueError for a device torch does not know or a GPU this machine does not have."""
    if device is None or device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA GPU is available here (use cpu or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")


def resolve_device(device) -> torch.device:
    """None / "auto": the GPU if there is one, else the CPU; else the checked device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device)
    return torch.device(device)


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """None / "auto": bfloat16 on CUDA, float32 elsewhere; else the checked dtype."""
    name = canonical_dtype(dtype)
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)
