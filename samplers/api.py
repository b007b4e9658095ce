"""`specar.generate`: the public entry point used by the nodes, the demo and the benchmarks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..model_loaders.contract import ARImageModel
from .backends import BACKENDS, DEFAULT_BACKEND, BackendConfig, make_backend
from .engine import SpeculativeEngine
from .stats import GenerationStats
from .target import SamplingParams


# reproducible ("same image as AR") unless the caller says otherwise (a lossy backend: off), for every
# backend: it costs 1-11% of step compression on the demo model (docs/REPRODUCIBLE.md,
# docs/history/BENCHMARKS-2026-11-27.md)
REPRODUCIBLE_DEFAULT = True


@dataclass
class GenerationResult:
    tokens: torch.Tensor  # [H, W] image codes ([B, H, W] when batch_size > 1), structure tokens removed
    image: object  # PIL image of the first sample, or None when the model has no decoder
    stats: GenerationStats
    images: Optional[list] = None  # every sample's PIL image (batch_size > 1)
    sequence: Optional[torch.Tensor] = None  # [B, seq_len] engine ids, structure tokens included


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return seed


def generate(model: ARImageModel, prompt, backend=DEFAULT_BACKEND, seed: int = 0, cfg_scale: Optional[float] = None,
             temperature: float = 1.0, top_k: Optional[int] = None, top_p: float = 1.0, negative_prompt: str = "",
             batch_size: int = 1, progress: Optional[Callable[[int, int], None]] = None,
             interrupt: Optional[Callable[[], bool]] = None, profile: bool = False, preview=None,
             compile: bool = False, reproducible: Optional[bool] = None, **backend_params) -> GenerationResult:
    """Generate image tokens (and the decoded image) with the chosen backend.

    Every lossless backend samples exactly the distribution of ``backend="ar"`` for the same
    sampling settings. ``cfg_scale`` and ``top_k`` default to the model's recommended values
    (None); ``top_k=0`` is no top-k (every image token).
    ``progress(done_tokens, total_tokens)`` is called once per step; ``interrupt()`` returning
    True stops the generation with `GenerationInterrupted` (the model stays usable). ``preview``: a
    `specar.samplers.preview.PartialImage` (or any object with ``due()`` and ``__call__(seq, done,
    at_step)``), asked at each step whether it wants the partial sequence; it never changes the tokens.
    ``compile=True`` runs the whole decode step through torch.compile (one static graph per plan,
    compiled on first use and kept for later generations on the model; the compile counters are in
    ``stats.compile``); where compiling fails it says so once and runs eager.
    ``backend``: a backend name (its parameters as keyword arguments), or a `BackendConfig` that
    `make_backend` already validated (the nodes: a choice is validated once).
    ``reproducible`` ("same image as AR", docs/REPRODUCIBLE.md): True (the default, None, for every
    lossless backend): every lossless backend gives exactly ``backend="ar"``'s tokens for the same
    seed and settings (row b of a batch: AR's row b), whatever it drafts; only the number of forwards
    differs. False: each backend verifies by rejection sampling with its own random draws (the same
    distribution, other images). A lossy backend (relaxed acceptance) needs False (None: False).
    """
    if not isinstance(model, ARImageModel):
        raise ValueError(f"model must be an ARImageModel (e.g. from specar.load_model), got {type(model).__name__}")
    if isinstance(backend, BackendConfig):
        if backend_params:
            raise ValueError(f"backend is an already validated {backend.name!r} configuration; pass its parameters "
                             f"to make_backend, not to generate (got {', '.join(sorted(backend_params))})")
        spec = backend
    else:
        spec = make_backend(backend, **backend_params)
    defaults = getattr(model, "default_sampling", {})
    sampling = SamplingParams(
        cfg_scale=defaults.get("cfg_scale", 1.0) if cfg_scale is None else cfg_scale,
        temperature=temperature,
        top_k=(defaults.get("top_k") or 0) if top_k is None else top_k,  # None: the model's; 0: off
        top_p=top_p,
    ).validated(model.geometry.vocab_size)
    _check_seed(seed)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(prompt, str):
        if not isinstance(negative_prompt, str):
            raise ValueError(f"negative_prompt must be a str, got {type(negative_prompt).__name__}")
        encoded = model.encode_prompt(prompt, negative_prompt)
    else:
        encoded = model.check_prompt(prompt)
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    if reproducible is not None and not isinstance(reproducible, bool):
        raise ValueError(f"reproducible must be True, False or None (the default: True for a lossless backend), "
                         f"got {reproducible!r}")
    engine = SpeculativeEngine(model, spec, sampling, seed, batch_size, profile=profile, compile=compile,
                               reproducible=reproducible)
    with torch.inference_mode():
        seq, stats = engine.run(encoded, progress=progress, interrupt=interrupt, preview=preview)
    geo = model.geometry
    grid = seq[:, geo.image_positions().to(seq.device)].view(batch_size, geo.height, geo.width).cpu()
    images = model.decode_tokens(grid)
    return GenerationResult(
        tokens=grid[0] if batch_size == 1 else grid,
        image=images[0] if images else None,
        stats=stats,
        images=images,
        sequence=seq.cpu(),
    )


__all__ = ["BACKENDS", "GenerationResult", "REPRODUCIBLE_DEFAULT", "generate"]
