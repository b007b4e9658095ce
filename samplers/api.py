"""`specar.generate`: the public entry point used by the nodes, the demo and the benchmarks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..model_loaders.contract import ARImageModel, EncodedPrompt
from .backends import BACKENDS, DEFAULT_BACKEND, BackendConfig, make_backend
from .engine import SpeculativeEngine
from .stats import GenerationStats, chained_stats
from .target import SamplingParams
from .threads import check_threads, torch_threads


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
    # a two-grid model (GLM-Image): the preceding stage's result (its grids, e.g. the preview's codes, and stats);
    # `stats` then cover both grids
    preceding: Optional["GenerationResult"] = None
    # the prompt the grid was generated from (a two-grid batch: image 0's, whose text the others share), what
    # `model.decode_tokens(tokens, prompt=...)` conditions a decoder on (GLM-Image's DiT)
    prompt: Optional[EncodedPrompt] = None


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return seed


def generate(model: ARImageModel, prompt, backend=DEFAULT_BACKEND, seed: int = 0, cfg_scale: Optional[float] = None,
             temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
             negative_prompt: str = "", batch_size: int = 1, progress: Optional[Callable[[int, int], None]] = None,
             interrupt: Optional[Callable[[], bool]] = None, profile: bool = False, preview=None,
             compile: bool = False, reproducible: Optional[bool] = None, pin_width: Optional[int] = None, threads=None,
             images=None, sampling: Optional[SamplingParams] = None,
             **backend_params) -> GenerationResult:
    """Generate image tokens (and the decoded image) with the chosen backend.

    Every lossless backend samples exactly the distribution of ``backend="ar"`` for the same
    sampling settings. ``cfg_scale``, ``temperature``, ``top_k`` and ``top_p`` default to the model's
    recommended values (None; `default_sampling`, else 1.0 and no top-k / top-p); ``top_k=0`` is no top-k.
    ``sampling``: the four as one `SamplingParams` instead (a None field: the model's value; the nodes pass this).
    A two-grid model (`ARImageModel.preceding_stage`, GLM-Image) generates both grids from a str prompt:
    ``tokens`` / ``image`` are the second grid's, ``preceding`` the first grid's result, ``stats`` cover both.
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
    ``pin_width`` (same-image mode): every target forward at that many tokens (AR's one token padded; at least
    the backend's widest forward), instead of the forward mode `batch_invariant.target_forward_mode` picks for the device
    (docs/REPRODUCIBLE.md, "Shape pinning"); None: the plan's choice.
    ``threads``: torch's CPU threads for this call only, restored after it (torch's global setting is left as it
    was, as ComfyUI expects): None (the default) leaves torch's setting alone; ``"auto"`` takes what ``make demo``
    takes, the cores other processes leave free (at least 1: on a busy machine more threads than free cores is
    the slowest choice); an int that many.
    ``images``: reference images for image-to-image (PIL images or float tensors 0..1 [H, W, C] / [B, H, W, C]),
    where the model takes them (``model.max_reference_images``: GLM-Image, 1 or 2); the model then samples its
    grid after the references (a two-grid model: its last grid only).
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
    loose = dict(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k, top_p=top_p)
    if sampling is not None and any(v is not None for v in loose.values()):
        raise ValueError(f"give the sampling settings as sampling= or as keyword arguments, not both (got sampling= and "
                         f"{', '.join(k for k, v in loose.items() if v is not None)})")
    asked = SamplingParams(**loose) if sampling is None else sampling  # a None field: the model's value
    defaults = {**dict(cfg_scale=1.0, temperature=1.0, top_p=1.0), **getattr(model, "default_sampling", {})}
    defaults["top_k"] = defaults.get("top_k") or 0  # None: the model's; 0: off
    sampling = SamplingParams(**{k: defaults[k] if getattr(asked, k) is None else getattr(asked, k) for k in loose}
                              ).validated(model.geometry.vocab_size)
    _check_seed(seed)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(prompt, str) and not isinstance(negative_prompt, str):
        raise ValueError(f"negative_prompt must be a str, got {type(negative_prompt).__name__}")
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    if reproducible is not None and not isinstance(reproducible, bool):
        raise ValueError(f"reproducible must be True, False or None (the default: True for a lossless backend), "
                         f"got {reproducible!r}")
    n_threads = check_threads(threads)
    run = dict(spec=spec, sampling=sampling, interrupt=interrupt,
               engine=dict(profile=profile, compile=compile, reproducible=reproducible, pin_width=pin_width))
    with torch_threads(n_threads):
        if images is not None:
            return _run(model, reference_prompt(model, prompt, images, negative_prompt), seed, batch_size, progress,
                        preview, **run)
        first = model.preceding_stage() if isinstance(prompt, str) else None
        if first is not None:
            return _after_preceding_stage(first, model, prompt, negative_prompt, seed, batch_size, progress, preview,
                                          run)
        encoded = model.encode_prompt(prompt, negative_prompt) if isinstance(prompt, str) else \
            model.check_prompt(prompt)
        return _run(model, encoded, seed, batch_size, progress, preview, **run)


def _run(model, encoded, seed, batch, progress, preview, spec, sampling, interrupt, engine) -> GenerationResult:
    """One grid: the engine's run from the encoded prompt, its tokens and the decoded images."""
    engine = SpeculativeEngine(model, spec, sampling, seed, batch, **engine)
    with torch.inference_mode():
        seq, stats = engine.run(encoded, progress=progress, interrupt=interrupt, preview=preview)
    geo = model.geometry
    grid = seq[:, geo.image_positions().to(seq.device)].view(batch, geo.height, geo.width).cpu()
    images = model.decode_tokens(grid, prompt=encoded)
    return GenerationResult(tokens=grid[0] if batch == 1 else grid, image=images[0] if images else None, stats=stats,
                            images=images, sequence=seq.cpu(), prompt=encoded)


def reference_prompt(model, prompt, images, negative_prompt):
    """The model's image-to-image prompt, or a ValueError naming the model and what it takes."""
    if not model.max_reference_images:
        raise ValueError(f"{model.name} ({type(model).__name__}) takes no reference images: image-to-image (generate's "
                         f"images=, the sampler node's reference_images input) is GLM-Image's only; generate without "
                         f"them for this model")
    if not isinstance(prompt, str):
        raise ValueError(f"with images, prompt must be the text (a str), got {type(prompt).__name__}")
    return model.reference_prompt(prompt, images, negative_prompt)


def stage_seed(seed: int, row: int) -> int:
    """The seed of image `row`'s grid after a preceding stage: its own random stream, apart from the preceding
    stage's (`seed`) and from the other images'."""
    return (seed + 0x9E3779B97F4A7C15 * (row + 1)) % 2 ** 64


def _after_preceding_stage(first, model, prompt, negative_prompt, seed, batch, progress, preview, run):
    """A two-grid model (`ARImageModel.preceding_stage`): the preceding stage's grids (the batch, `seed`), then
    each image's grid after its own codes (one run per image, `stage_seed`: each prompt ends with that image's
    codes). One progress bar over both grids; the live preview (built for `model`'s grid) shows the first grid, then
    the second (`preview.for_stage`, where the preview has it)."""
    n_first, n = first.geometry.seq_len, model.geometry.seq_len
    total = batch * (n_first + n)

    def spanning(offset):
        return None if progress is None else (lambda done, _: progress(offset + done, total))

    first_preview = preview.for_stage(first) if hasattr(preview, "for_stage") else None
    head = _run(first, first.encode_prompt(prompt, negative_prompt), seed, batch, spanning(0), first_preview, **run)
    codes = head.tokens.reshape(batch, -1)
    rows = [_run(model, model.prompt_after(prompt, codes[b], negative_prompt), stage_seed(seed, b), 1,
                 spanning(batch * n_first + b * n), preview, **run) for b in range(batch)]
    images = [r.image for r in rows] if rows[0].images else None
    return GenerationResult(
        tokens=rows[0].tokens if batch == 1 else torch.stack([r.tokens for r in rows]),
        image=rows[0].image, images=images, stats=chained_stats(head.stats, [r.stats for r in rows]),
        sequence=torch.cat([r.sequence for r in rows]), preceding=head, prompt=rows[0].prompt)


__all__ = ["BACKENDS", "GenerationResult", "REPRODUCIBLE_DEFAULT", "SamplingParams", "generate"]
