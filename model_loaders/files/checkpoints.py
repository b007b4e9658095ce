"""Safe loading of the authors' checkpoint files (`.pt` / `.ckpt` / `.safetensors`).

Pickled checkpoints are opened with ``torch.load(weights_only=True)`` only: tensors and plain
containers load, anything that would run code (pickled classes, Lightning callbacks, ...) is
refused with a message naming the file. `convert_checkpoint` writes the tensors of a checkpoint
that loads safely to a safetensors file (``python -m specar convert-checkpoint IN OUT``), which
loads faster and without pickle.
"""
from __future__ import annotations

import json
import os
from typing import Iterable

import torch

# where the authors' training scripts keep the weights inside a checkpoint dictionary
STATE_KEYS = ("state_dict", "model", "module", "ema")


def read_json_object(path: str, fix: str = "") -> dict:
    """A JSON file holding an object (config.json, drafter.json), or a ValueError naming the file
    (`fix`: what the user should do, appended to the message)."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}){fix}") from e
    if not isinstance(obj, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(obj).__name__}{fix}")
    return obj


def _reason(err: Exception) -> str:
    """torch.load's reason in one whole sentence: the line naming the refused object (its "WeightsUnpickler error:
    Unsupported global: ..." line), else its first sentence."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    named = next((line for line in lines if "Unsupported global" in line or "WeightsUnpickler" in line), None)
    text = named or (lines[0] if lines else type(err).__name__)
    return text.split(". ")[0].rstrip(".") if named is None else text.rstrip(".")


def _refuse(path: str, err: Exception) -> ValueError:
    return ValueError(
        f"{path} cannot be loaded safely: torch.load(weights_only=True) refused it ({_reason(err)}). SpecAR never "
        f"unpickles arbitrary objects. If you trust the file, convert it once in a Python session you control: "
        f"`import torch, safetensors.torch as st; ck = torch.load(PATH, weights_only=False); sd = "
        f"ck.get('state_dict', ck.get('model', ck)); st.save_file({{k: v.contiguous() for k, v in sd.items()}}, "
        f"'OUT.safetensors')` and put OUT.safetensors next to it")


def load_state_dict(path: str, keys: Iterable[str] = STATE_KEYS) -> dict:
    """Tensors of a checkpoint file: a safetensors file, or a pickle opened with weights_only=True
    (unwrapping one of `keys` when the weights sit under it). Errors name the file."""
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint file {path} is missing")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(path)
        except Exception as e:  # header or data corrupt
            raise ValueError(f"{path} is not a valid safetensors file: {e}") from e
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError for pickled objects, RuntimeError for corrupt archives
        raise _refuse(path, e) from e
    if isinstance(obj, dict):
        for k in keys:
            if isinstance(obj.get(k), dict):
                obj = obj[k]
                break
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors (looked at the top level and under "
                         f"{', '.join(keys)})")
    return obj


def load_into(module: torch.nn.Module, state: dict, path: str, prefix: str = "", ignore=()) -> None:
    """Copy `state` (keys under `prefix`) into `module`; every parameter must be present with its
    shape, and nothing but the `ignore` prefixes may be left over. Errors name the file."""
    own = module.state_dict()
    sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    missing = sorted(set(own) - set(sub))
    extra = sorted(k for k in set(sub) - set(own) if not k.startswith(tuple(ignore)))
    wrong = sorted(k for k in set(own) & set(sub) if tuple(own[k].shape) != tuple(sub[k].shape))
    problems = weight_mismatch([prefix + k for k in missing], [prefix + k for k in extra],
                               [f"{prefix}{k} {tuple(sub[k].shape)} vs {tuple(own[k].shape)}" for k in wrong])
    if problems:
        raise ValueError(f"weights in {path} do not match the expected architecture: {problems}")
    module.load_state_dict({k: sub[k] for k in own}, strict=True)


def weight_mismatch(missing: list, unexpected: list, wrong_shape: list) -> str:
    """"missing (n): a, b ...; unexpected (n): ...; wrong shape (n): ..." for the lists that are not empty
    (their first four names each), or "" when all are."""
    return "; ".join(f"{what} ({len(items)}): {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
                     for what, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape))
                     if items)


def convert_checkpoint(src: str, dst: str) -> int:
    """Write the tensors of `src` (loaded safely) to the safetensors file `dst`; returns the count."""
    from safetensors.torch import save_file

    if not dst.endswith(".safetensors"):
        raise ValueError(f"the output file must end in .safetensors, got {dst!r}")
    state = load_state_dict(src)
    save_file({k: v.contiguous() for k, v in state.items()}, dst)
    return len(state)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specar convert-checkpoint",
                                 description="convert a .pt/.ckpt checkpoint (loaded with weights_only=True) to safetensors")
    ap.add_argument("src")
    ap.add_argument("dst")
    a = ap.parse_args(argv)
    n = convert_checkpoint(a.src, a.dst)
    print(f"wrote {n} tensors to {a.dst}")
