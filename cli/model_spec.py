"""The model a command runs, from its `--model` spec: a built-in name or a model folder (load_model), or
`tiny:VOCAB,HxW[,row_end][,key=value...]`, a random-weight model (model_loaders/tiny.py) for checking a command
and for the bench's `flat` regime. `check_model_options` checks a spec and its options without torch (the loader
checks them all again: this answers the common mistakes in well under a second)."""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys

from ..model_loaders.files.hub_cache import is_repo_id

# tiny:...,key=value options: tiny_model's keyword and its type
TINY_OPTIONS = {"hidden": ("hidden_size", int), "layers": ("num_layers", int), "heads": ("num_heads", int),
                "scale": ("logit_scale", float), "seed": ("seed", int)}
OFFLOADS = ("none", "auto")  # model_loaders/resolutions.py's, for the families whose `ModelFamily.offload` is set
RESOLUTION = re.compile(r"^[1-9][0-9]*x[1-9][0-9]*$")


def parse_tiny(spec: str) -> tuple:
    """(vocab, (H, W), tiny_model's keywords) of tiny:vocab,HxW[,row_end][,hidden=..,layers=..,heads=..,scale=..,
    seed=..]; ValueError naming --model and the expected form (every number an integer >= 1, scale > 0)."""
    parts = [p.strip() for p in spec[5:].split(",")]
    try:
        vocab = int(parts[0])
        h, w = (int(x) for x in parts[1].split("x"))
        kwargs = {"seed": 0}
        for part in parts[2:]:
            if part == "row_end":
                kwargs["row_end"] = True
                continue
            key, eq, value = part.partition("=")
            if not eq or key not in TINY_OPTIONS:
                raise ValueError(part)
            name, kind = TINY_OPTIONS[key]
            kwargs[name] = kind(value)
        if min(vocab, h, w) < 1 or any(v < (0 if k == "seed" else 1) for k, v in kwargs.items()
                                       if k not in ("row_end", "logit_scale")) \
                or not kwargs.get("logit_scale", 1.0) > 0:
            raise ValueError(spec)
    except (ValueError, IndexError):
        raise ValueError(f"--model: bad tiny model spec {spec!r}; expected tiny:VOCAB,HxW[,row_end][,key=value...] "
                         f"with VOCAB, H, W integers >= 1 and keys {', '.join(TINY_OPTIONS)}") from None
    return vocab, (h, w), kwargs


def no_cuda_here() -> bool:
    """No CUDA GPU usable, known without importing torch: a CPU build of torch, a Mac, or Linux without an NVIDIA (or
    ROCm) driver; False when torch is not even installed (its own check answers)."""
    try:
        cpu_build = importlib.metadata.version("torch").endswith("+cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return cpu_build or sys.platform == "darwin" or (sys.platform.startswith("linux") and not any(
        map(os.path.exists, ("/proc/driver/nvidia", "/dev/kfd"))))


def check_model_options(spec: str, dtype=None, quantize="none", resolution=None, offload="none", device=None) -> None:
    """What can be refused before torch is loaded: a tiny spec, options a tiny model ignores, a folder that does not
    exist or is empty, a size or offload for the built-in demo model, the resolution's form, the offload choice,
    quantize with offload and cuda without a GPU (the family's own limits are checked when it loads)."""
    if isinstance(device, str) and device.startswith("cuda") and no_cuda_here():
        raise ValueError(f"--device {device}: no CUDA GPU is available here (use cpu or auto)")
    if offload not in OFFLOADS:
        raise ValueError(f"--offload must be one of {', '.join(OFFLOADS)}, got {offload!r}")
    if resolution is not None and not RESOLUTION.match(resolution):
        raise ValueError(f"--resolution must be WIDTHxHEIGHT in pixels (e.g. 768x768), got {resolution!r}")
    if quantize not in (None, "none") and offload != "none":
        raise ValueError(f"--quantize {quantize} loads the whole model on the device: it does not combine with "
                         f"--offload {offload}")
    if spec.startswith("tiny:"):
        parse_tiny(spec)
        given = [name for name, value in (("--dtype", dtype), ("--resolution", resolution)) if value is not None]
        given += ["--quantize"] if quantize not in (None, "none") else []
        given += ["--offload"] if offload != "none" else []
        if given:
            raise ValueError(f"{', '.join(given)}: only for a model loaded from files (demo, a model folder); a "
                             f"tiny: model is float32, unquantized, on one device, at the size its spec gives")
    elif spec == "demo" and (resolution is not None or offload != "none"):
        raise ValueError(f"{'--offload' if resolution is None else '--resolution'}: the built-in model 'demo' generates "
                         f"at its own size only, loaded whole: leave the option out")
    elif spec != "demo" and not is_repo_id(spec) and not (os.path.isdir(spec) and os.listdir(spec)):
        raise ValueError(f"--model {spec!r}: {'the folder is empty' if os.path.isdir(spec) else 'no such folder'} "
                         f"(give demo, a folder with a released checkpoint's files, or a Hugging Face repo id "
                         f"'org/name' in the local cache)")


def model_from_spec(spec: str, device=None, dtype=None, quantize: str = "none", resolution=None, offload="none"):
    check_model_options(spec, dtype, quantize, resolution, offload, device)
    if spec.startswith("tiny:"):
        from ..model_loaders.tiny import tiny_model
        vocab, grid, kwargs = parse_tiny(spec)
        return tiny_model(vocab, grid, device=device or "cpu", **kwargs)
    from ..model_loaders.registry import load_model
    from ..model_loaders.resolutions import MODEL_DEFAULT, load_options
    options = load_options(spec, resolution or MODEL_DEFAULT, offload) if resolution or offload != "none" else {}
    return load_model(spec, device=device, dtype=dtype, quantize=quantize, **options)
