"""What the nodes do, as plain functions testable without ComfyUI.

ComfyUI modules (`folder_paths`, `comfy.*`) are imported lazily and only where needed, so this
module (and the whole pack) imports without ComfyUI installed.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

import torch

from ..model_loaders.registry import BUILTIN_MODELS, load_model
from ..samplers.api import generate
from ..samplers.backends import BACKEND_PARAMS, BACKENDS, COUPLINGS, INITS, MAX_WINDOW

FOLDER = "specar"  # ComfyUI/models/specar/<model folder>
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
_cache: dict = {}


def model_folders() -> list:
    """Sub-folders of every registered models/specar path (HF-style model folders)."""
    try:
        import folder_paths
    except ImportError:
        return []
    names = []
    for base in folder_paths.get_folder_paths(FOLDER):
        if os.path.isdir(base):
            names += sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    return names


def model_choices() -> list:
    return list(BUILTIN_MODELS) + [n for n in model_folders() if n not in BUILTIN_MODELS]


def _resolve(name: str) -> str:
    if name in BUILTIN_MODELS:
        return name
    try:
        import folder_paths
        for base in folder_paths.get_folder_paths(FOLDER):
            path = os.path.join(base, name)
            if os.path.isdir(path):
                return path
    except ImportError:
        pass
    raise ValueError(f"model {name!r} not found: choose one of {', '.join(model_choices())}")


def _device(choice: str) -> str:
    if choice == "auto":
        try:
            import comfy.model_management as mm
            return str(mm.get_torch_device())
        except ImportError:
            return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was chosen but no CUDA GPU is available; choose cpu or auto")
    return choice


def load_cached(name: str, device: str = "auto", dtype: str = "auto"):
    """Load a model once and keep it across runs (one model at a time: loading another frees it)."""
    for what, value, allowed in (("device", device, DEVICES), ("dtype", dtype, DTYPES)):
        if value not in allowed:
            raise ValueError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    key = (name, device, dtype)
    if key not in _cache:
        free_models()
        _cache[key] = load_model(_resolve(name), device=_device(device), dtype=None if dtype == "auto" else dtype)
    return _cache[key]


def free_models():
    """Drop cached models (ComfyUI's 'free memory' calls this through the hook in comfy_nodes)."""
    _cache.clear()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def backend_kwargs(backend: str, values: dict) -> dict:
    """The widget values that belong to the chosen backend."""
    if backend not in BACKEND_PARAMS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    return {k: values[k] for k in BACKEND_PARAMS[backend] if k in values}


def heatmap(accepted_at_step: list, size: Optional[tuple] = None) -> torch.Tensor:
    """[H, W, 3] float image: each token coloured by how many tokens its step committed
    (dark blue: one, yellow: the longest step), with step boundaries visible as colour changes."""
    steps = torch.tensor(accepted_at_step)
    counts = torch.bincount(steps.flatten())
    length = counts[steps].float()  # tokens committed by the step that committed each token
    t = (length - 1) / max(float(length.max()) - 1, 1.0)
    stops = torch.tensor([[0.27, 0.00, 0.33], [0.23, 0.32, 0.55], [0.13, 0.57, 0.55], [0.37, 0.79, 0.38],
                          [0.99, 0.91, 0.14]])  # viridis-like
    x = t * (len(stops) - 1)
    i = x.floor().long().clamp(max=len(stops) - 2)
    frac = (x - i)[..., None]
    img = stops[i] * (1 - frac) + stops[i + 1] * frac
    if size is not None:
        img = torch.nn.functional.interpolate(img.permute(2, 0, 1)[None], size=size, mode="nearest")[0].permute(1, 2, 0)
    return img


def pil_to_tensor(images) -> torch.Tensor:
    import numpy as np
    return torch.stack([torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0) for im in images])


def summary(stats, ar_tokens: int) -> str:
    speed = f"{stats.step_compression:.1f}x fewer"
    return (f"AR {ar_tokens} steps -> {stats.backend.upper()} {stats.nfe + 1} steps, {speed}, "
            f"{stats.latency_s:.1f} s")


def run_sampler(model, prompt: str, negative_prompt: str, seed: int, backend: str, cfg_scale: float,
                temperature: float, top_k: int, top_p: float, batch_size: int = 1,
                progress: Optional[Callable] = None, interrupt: Optional[Callable] = None, **widgets):
    """Generate and return (IMAGE [B,H,W,C], tokens, stats JSON, heatmap IMAGE [1,h,w,3], summary)."""
    res = generate(model, prompt, backend=backend, seed=seed, cfg_scale=None if cfg_scale < 0 else cfg_scale,
                   temperature=temperature, top_k=None if top_k == 0 else top_k, top_p=top_p,
                   negative_prompt=negative_prompt, batch_size=batch_size, progress=progress, interrupt=interrupt,
                   **backend_kwargs(backend, widgets))
    geo = model.geometry
    if res.images:
        image = pil_to_tensor(res.images)
    else:  # no decoder: show the codes as grey levels
        codes = res.tokens.reshape(batch_size, geo.height, geo.width).float() / max(geo.vocab_size - 1, 1)
        image = codes[..., None].expand(-1, -1, -1, 3).contiguous()
    heat = heatmap(res.stats.accepted_at_step[0], size=tuple(image.shape[1:3]))[None]
    stats = res.stats.to_dict()
    text = summary(res.stats, geo.num_image_tokens)
    stats["summary"] = text
    tokens = {"tokens": res.tokens.reshape(batch_size, geo.height, geo.width), "model": model}
    return image, tokens, json.dumps(stats), heat, text


def decode_tokens(tokens: dict) -> torch.Tensor:
    images = tokens["model"].decode_tokens(tokens["tokens"])
    if not images:
        raise ValueError("this model has no image decoder")
    return pil_to_tensor(images)


__all__ = ["COUPLINGS", "INITS", "MAX_WINDOW", "model_choices", "load_cached", "run_sampler", "decode_tokens"]
