"""Loading a transformers checkpoint safely: safetensors only, no remote code, nothing downloaded, clear
errors for a config / weights mismatch and missing files, a memory check with the size needed, and the
oldest transformers the adapters work with (`require_transformers`)."""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import torch
from safetensors import SafetensorError

from .. import offload

# the oldest transformers release whose Janus / Emu3 / Chameleon classes our adapters are tested with
# (`make test-floor` runs the family-loader tests on it); requirements.txt and pyproject.toml say the same
TRANSFORMERS_FLOOR = (4, 56)


def transformers_version() -> tuple:
    """(major, minor) of the installed transformers, (0, 0) when it is missing."""
    try:
        import transformers
    except ImportError:
        return (0, 0)
    parts = (transformers.__version__.split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


def require_transformers(family: str) -> None:
    """One clear line when the installed transformers is older than the adapters need."""
    have = transformers_version()
    if have < TRANSFORMERS_FLOOR:
        import importlib.util
        floor = ".".join(map(str, TRANSFORMERS_FLOOR))
        installed = "not installed" if importlib.util.find_spec("transformers") is None else \
            f"you have {__import__('transformers').__version__}"
        raise ValueError(f"{family} models need transformers >= {floor}, {installed}: pip install -U "
                         f"\"transformers>={floor}\" (in ComfyUI's Python environment)")


def require_file(folder: str, *names: str, what: str) -> str:
    """The first of `names` present in `folder`, or a ValueError naming the file(s) and their role."""
    for n in names:
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            return p
    raise ValueError(f"{what} file {' or '.join(names)} is missing in {folder!r} "
                     f"(copy it from the checkpoint's repository; nothing is downloaded)")


def safetensors_files(folder: str) -> list:
    """The weight files of a checkpoint; pickle-only checkpoints are refused."""
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e}") from e
        files = [os.path.join(folder, n) for n in names]
        for p in files:
            if not os.path.isfile(p):
                raise ValueError(f"weight file {p} listed in {index} is missing")
        return files
    if os.path.isfile(single):
        return [single]
    pickles = [n for n in os.listdir(folder) if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    if pickles:
        raise ValueError(f"{folder!r} has only pickle weights ({', '.join(sorted(pickles))}); SpecAR loads "
                         f"safetensors only (model.safetensors or model.safetensors.index.json)")
    raise ValueError(f"weights file model.safetensors (or model.safetensors.index.json) is missing in {folder!r}")


def weight_bytes(files: Sequence[str], dtype: torch.dtype) -> int:
    """Bytes the weights take in `dtype` (floating tensors converted), from the safetensors headers."""
    size = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
    floating = {"F64", "F32", "F16", "BF16"}
    target = torch.finfo(dtype).bits // 8
    total = 0
    for p in files:
        try:
            with open(p, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
        except (OSError, ValueError) as e:
            raise ValueError(f"{p} is not a valid safetensors file: {e}") from e
        for name, info in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in info["shape"]:
                numel *= d
            total += numel * (target if info["dtype"] in floating else size.get(info["dtype"], 4))
    return total


def check_memory(files, dtype: torch.dtype, device: torch.device, device_map, extra_bytes: int = 0) -> None:
    """A model that cannot fit on one GPU fails before loading, with the memory it needs."""
    if device.type != "cuda" or device_map is not None:
        return
    need = weight_bytes(files, dtype) + extra_bytes
    try:
        free, total = torch.cuda.mem_get_info(device)
    except Exception:  # pragma: no cover - no CUDA runtime
        return
    if need > free:
        gib = 1024 ** 3
        raise ValueError(f"the model needs about {need / gib:.1f} GiB of GPU memory in {str(dtype).split('.')[-1]} "
                         f"but {device} has {free / gib:.1f} GiB free (of {total / gib:.1f} GiB); use "
                         f"dtype='bf16', or device_map='auto' (offload: the decoder layers that do not fit in CPU "
                         f"memory), or a smaller checkpoint")


def load_pretrained(cls, folder: str, device: torch.device, dtype: torch.dtype, device_map=None, max_memory=None,
                    offload_folder=None, attn_implementation: Optional[str] = None, allow_missing=(), quantize=None,
                    layers: str = "model.layers"):
    """`cls.from_pretrained` from a local folder only: safetensors, no remote code, and every
    checkpoint tensor must match the config (no silently random-initialised weights), except
    missing parameters under the `allow_missing` prefixes (parts image generation never runs).
    ``device_map="auto"``: the decoder layers (the module list `layers`) placed by offload.py, the rest on `device`.
    ``quantize`` ("int8" / "int4", precision/quantize.py): the linear layers are quantized in CPU memory,
    before the model moves to `device`, so the device only ever holds the quantized weights."""
    from ..precision.quantize import check_mode, quantize_module

    quantize = check_mode(quantize)  # not with device_map: registry.load_model refuses the pair
    files = safetensors_files(folder)
    if quantize == "none":  # quantized, the weights need about a third (int4) to a half (int8) of this
        check_memory(files, dtype, device, device_map)
    # transformers >= 4.56 takes `dtype`; before, the same setting was `torch_dtype`
    kwargs = {"dtype" if transformers_version() >= (4, 56) else "torch_dtype": dtype}
    kwargs.update(local_files_only=True, use_safetensors=True, trust_remote_code=False, output_loading_info=True)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if device_map is not None:  # accelerate's big-model loading (None: from_pretrained's own defaults)
        with torch.device("meta"):
            net = cls(cls.config_class.from_pretrained(folder, local_files_only=True))
        offload.placement(layers, device_map, device, dtype, max_memory)(net)
        kwargs.update(device_map=net.hf_device_map, offload_folder=offload.scratch_folder(offload_folder))
    weights = files[0] if len(files) == 1 else os.path.join(folder, "model.safetensors.index.json")
    try:
        model, info = cls.from_pretrained(folder, **kwargs)
    except SafetensorError as e:
        raise ValueError(f"cannot read the weights in {weights}: {e} (a damaged or partly downloaded file? copy "
                         f"it again)") from e
    except (RuntimeError, ValueError, OSError, KeyError) as e:
        msg = str(e)
        if "mismatch" in msg.lower() or "shape" in msg.lower():
            raise ValueError(f"weights in {weights} do not match {os.path.join(folder, 'config.json')}: {msg[:500]}") from e
        raise ValueError(f"could not load {folder!r} as {cls.__name__}: {msg[:500]}") from e
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        items = list(info.get(key) or [])
        if key == "missing_keys":
            items = [i for i in items if not str(i).startswith(tuple(allow_missing))]
        if items:
            shown = ", ".join(str(i) for i in items[:5]) + (" ..." if len(items) > 5 else "")
            problems.append(f"{key.replace('_', ' ')} ({len(items)}): {shown}")
    if problems:
        raise ValueError(f"weights in {weights} do not match {os.path.join(folder, 'config.json')}: "
                         + "; ".join(problems))
    if device_map is None:
        quantize_module(model, quantize)
        model = model.to(device)
    else:
        offload.remove_with(model, kwargs["offload_folder"])
    return model.eval()


def load_tokenizer(folder: str):
    """The folder's tokenizer, local files only; a missing file is a ValueError naming it."""
    require_file(folder, "tokenizer_config.json", what="tokenizer")
    require_file(folder, "tokenizer.json", "tokenizer.model", "vocab.json", what="tokenizer")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"could not load the tokenizer of {folder!r} (tokenizer.json / tokenizer_config.json): {e}") from e

