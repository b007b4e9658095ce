"""GLM-Image's files: where the released folder keeps each part, and one check that names every missing file at
once (the loader node runs it when a folder is listed and when a prompt is queued; `load_model` runs it first).

The released folder (zai-org/GLM-Image, diffusers' `GlmImagePipeline` layout, `model_index.json` at its root): which
sub-folder holds which files, and what reads them, is docs/NODES.md's table (`DIT_PARTS` below: the DiT's). The last
five are read by diffusers only (the DiT decode): they are checked where diffusers is installed and the folder has any
of them; a folder with none of them (or `vision_language_encoder/` alone) loads tokens only.
"""
from __future__ import annotations

import importlib.util
import json
import os

AR, PROCESSOR = "vision_language_encoder", "processor"
# the DiT's parts: (folder, files every one of which must be there, the weights' stem or None)
DIT_PARTS = (("transformer", ("config.json",), "diffusion_pytorch_model"),
             ("vae", ("config.json",), "diffusion_pytorch_model"),
             ("text_encoder", ("config.json",), "model"),
             ("tokenizer", ("tokenizer_config.json",), None),
             ("scheduler", ("scheduler_config.json",), None))


def layout_folders(folder: str):
    """(AR folder, processor folder, pipeline folder or None) of the released layout (model_index.json with
    vision_language_encoder/ and processor/) or of an AR folder alone (config.json; its processor beside it or in
    ../processor)."""
    if os.path.isfile(os.path.join(folder, "model_index.json")):
        return os.path.join(folder, AR), os.path.join(folder, PROCESSOR), folder
    up = os.path.dirname(os.path.normpath(folder))
    if os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        return folder, folder, None
    pipeline = up if os.path.isfile(os.path.join(up, "model_index.json")) else None
    return folder, os.path.join(up, PROCESSOR), pipeline


def missing_weights(folder: str, stem: str) -> list:
    """The missing weight files of `folder`: `stem`.safetensors, or the shards its .index.json names."""
    index = os.path.join(folder, f"{stem}.safetensors.index.json")
    if os.path.isfile(os.path.join(folder, f"{stem}.safetensors")):
        return []
    if not os.path.isfile(index):
        return [os.path.join(folder, f"{stem}.safetensors (or {stem}.safetensors.index.json and its shards)")]
    try:
        with open(index, encoding="utf-8") as f:
            shards = sorted(set((json.load(f) or {}).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError) as e:
        return [f"{index} (unreadable: {e})"]
    return [os.path.join(folder, s) for s in shards if not os.path.isfile(os.path.join(folder, s))]


def _has_chat_template(proc: str) -> bool:
    if any(os.path.isfile(os.path.join(proc, f)) for f in ("chat_template.jinja", "chat_template.json")):
        return True
    for name in ("processor_config.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(proc, name), encoding="utf-8") as f:
                if (json.load(f) or {}).get("chat_template"):
                    return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def has_dit(pipeline) -> bool:
    """Whether the released layout's folder `pipeline` (None: not that layout) holds any of the DiT's parts: without
    all five it loads tokens only (the AR stage alone), with some it must hold every file of them."""
    return pipeline is not None and any(os.path.isdir(os.path.join(pipeline, sub)) for sub, _, _ in DIT_PARTS)


def missing_files(folder: str, decoder: bool = None) -> list:
    """Every file of GLM-Image's released layout that `folder` lacks (empty: complete). `decoder`: check the DiT's
    parts too (None: where diffusers is installed and the folder has any of the DiT's parts, `has_dit`)."""
    ar, proc, pipeline = layout_folders(folder)
    missing = [os.path.join(ar, f) for f in ("config.json", "generation_config.json")
               if not os.path.isfile(os.path.join(ar, f))]
    missing += missing_weights(ar, "model")
    missing += [os.path.join(proc, f) for f in ("tokenizer.json", "tokenizer_config.json")
                if not os.path.isfile(os.path.join(proc, f))]
    if not any(os.path.isfile(os.path.join(proc, f)) for f in ("processor_config.json", "preprocessor_config.json")):
        missing.append(os.path.join(proc, "processor_config.json (or preprocessor_config.json)"))
    if not _has_chat_template(proc):
        missing.append(os.path.join(proc, "chat_template.jinja"))
    if decoder is None:
        decoder = has_dit(pipeline) and importlib.util.find_spec("diffusers") is not None
    for sub, files, stem in DIT_PARTS if decoder and pipeline is not None else ():
        part = os.path.join(pipeline, sub)
        missing += [os.path.join(part, f) for f in files if not os.path.isfile(os.path.join(part, f))]
        missing += missing_weights(part, stem) if stem else []
    return missing


def check_folder(folder: str) -> None:
    """A ValueError naming every missing file of the GLM-Image folder `folder` at once (nothing: complete)."""
    missing = [os.path.relpath(m, folder) for m in missing_files(folder)]
    if missing:
        raise ValueError(f"the GLM-Image folder {folder!r} is missing {len(missing)} file"
                         f"{'s' if len(missing) > 1 else ''}: {'; '.join(missing)} (the released layout: "
                         f"docs/NODES.md, GLM-Image)")


def read_generation_config(folder: str) -> dict:
    p = os.path.join(folder, "generation_config.json")
    try:
        with open(p, encoding="utf-8") as f:
            return json.load(f) or {}
    except (OSError, ValueError):
        return {}
