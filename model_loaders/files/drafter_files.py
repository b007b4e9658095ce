"""Trained drafter files (Hawk heads, EAGLE layers): one folder per drafter with

    drafter.safetensors   the weights (safetensors only: nothing is unpickled)
    drafter.json          {"kind", "format", "config": {...}, "target": {"name", "fingerprint", ...},
                           "training": {...}}

The target section names the model the drafter was trained on and a fingerprint of its
weights (fingerprint.py); loading a drafter for another model is refused with a clear error
(a mismatched drafter would still be lossless, only slow, so refusing is about not wasting the
user's time). A model finds its drafters beside its weights: ``<model folder>/<folder name>``, the name
declared by the method's package (hawk_heads, eagle_drafter, spatial_heads): this module holds no
table of methods (it is below samplers/, docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import json
import os
from typing import Optional

import torch

from .checkpoints import read_json_object
from .fingerprint import fingerprint_mismatch, weights_fingerprint

FORMAT = 1
WEIGHTS_FILE = "drafter.safetensors"
CONFIG_FILE = "drafter.json"
TRAIN_COMMAND = "python -m specar train-drafter --kind {kind} --model {model} --out {out}"


def drafter_folder(model, name: str) -> Optional[str]:
    """Where `model`'s drafter stored in the folder `name` beside its weights lives (None when the model
    has no folder)."""
    base = getattr(model, "folder", None)
    return None if base is None else os.path.join(base, name)


def target_section(model) -> dict:
    geo = model.geometry
    return {"name": model.name, "fingerprint": weights_fingerprint(model.torch_module()),
            "vocab_size": geo.vocab_size, "grid": [geo.height, geo.width], "row_end": geo.row_end,
            "hidden_size": model.hidden_size}


def save_drafter(folder: str, kind: str, model, tensors: dict, config: dict, training: Optional[dict] = None) -> None:
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, os.path.join(folder, WEIGHTS_FILE))
    meta = {"kind": kind, "format": FORMAT, "config": config, "target": target_section(model),
            "training": training or {}}
    with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)


def missing_drafter_error(model, kind: str, folder: Optional[str], beside: str = "") -> ValueError:
    """`beside`: the folder name the drafter would have beside the model's weights (for the message)."""
    where = folder or f"<model folder>/{beside or kind + '_drafter'}"
    name = getattr(model, "folder", None) or model.name
    return ValueError(f"no {kind} drafter for model {model.name!r}: {where} has no {CONFIG_FILE} / {WEIGHTS_FILE}. "
                      f"Train one with: " + TRAIN_COMMAND.format(kind=kind, model=name, out=where))


def load_drafter(folder: Optional[str], kind: str, model, device=None, beside: str = ""):
    """(tensors, meta) of a drafter folder, checked: files present and readable, the kind, and
    the target's fingerprint. Every failure is a ValueError naming the file and the fix (`beside`:
    the drafter's folder name beside the model's weights, named when there is no folder)."""
    if folder is None or not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        raise missing_drafter_error(model, kind, folder, beside)
    cfg_path, w_path = os.path.join(folder, CONFIG_FILE), os.path.join(folder, WEIGHTS_FILE)
    meta = read_json_object(cfg_path, "; retrain the drafter")
    if meta.get("kind") != kind:
        raise ValueError(f"{cfg_path} describes a {meta.get('kind')!r} drafter, not a {kind!r} one")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{cfg_path} has format {meta.get('format')!r}; this SpecAR reads format {FORMAT}")
    target = meta.get("target") or {}
    why = fingerprint_mismatch(target.get("fingerprint") or {}, weights_fingerprint(model.torch_module()))
    if why is not None:
        raise ValueError(f"{cfg_path} was trained for model {target.get('name')!r}, not for the loaded model "
                         f"{model.name!r} ({why}); train a drafter for this model with: "
                         + TRAIN_COMMAND.format(kind=kind, model=getattr(model, 'folder', None) or model.name,
                                                out=folder))
    if not os.path.isfile(w_path):
        raise ValueError(f"{w_path} is missing (its {CONFIG_FILE} is there); retrain or recopy the drafter")
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        tensors = load_file(w_path, device=str(device or "cpu"))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{w_path} is corrupt ({e}); retrain or recopy the drafter") from e
    return tensors, meta


def use_random_drafter(model, folder: str, path: Optional[str]) -> bool:
    """Tiny test models (``random_drafter_seed``) get random-weight drafters when no folder was
    asked for and no drafter file lies at `path` (where the model's own would be)."""
    has_file = path is not None and os.path.isfile(os.path.join(path, CONFIG_FILE))
    return not has_file and not folder and getattr(model, "random_drafter_seed", None) is not None


def load_heads_config(path: Optional[str], kind: str, model, config_cls, label: str, beside: str = ""):
    """(tensors, config) of a folder of draft heads on the target's hidden states: `load_drafter`'s
    checks, the config parsed as `config_cls` (named `label` in errors) and its width matched to
    the model's hidden size."""
    tensors, meta = load_drafter(path, kind, model, beside=beside)
    try:
        cfg = config_cls(**meta["config"])
    except TypeError as e:
        raise ValueError(f"{path}: drafter.json config is not a {label} config ({e}); retrain the heads") from e
    if cfg.hidden_size != model.hidden_size:
        raise ValueError(f"{path}: heads of width {cfg.hidden_size} != the model's hidden size {model.hidden_size}")
    return tensors, cfg


def check_shapes(path: str, tensors: dict, expected: dict) -> None:
    """Every expected tensor present with its shape (expected: name -> shape), nothing else."""
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    want = {k: tuple(v) for k, v in expected.items()}
    if got != want:
        bad = sorted(set(got) ^ set(want)) or [k for k in want if got[k] != want[k]]
        raise ValueError(f"{path} does not match its {CONFIG_FILE} (first mismatches: {bad[:3]})")
