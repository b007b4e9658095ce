"""`specar.generate`: the public entry point used by the nodes, the demo and the benchmarks."""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, fields, replace
from typing import Callable, Optional, Union

import torch

from ..model_loaders.contract import ARImageModel, EncodedPrompt
from .backends import DEFAULT_BACKEND, SCHEMAS, BackendConfig, make_backend
from .drafters.params import Param
from .engine import SpeculativeEngine
from .stats import GenerationStats, chained_stats
from .target import SamplingParams
from .threads import choose_threads, torch_threads


# reproducible ("same image as AR") unless the caller says otherwise (a lossy backend: off), for every
# backend: it costs 1-11% of step compression on the demo model (docs/REPRODUCIBLE.md)
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


@dataclass(frozen=True)
class RunOptions:
    """How a generation runs, never which distribution it samples (the README's "Python API" section)."""
    reproducible: Optional[bool] = None  # same image as AR (docs/REPRODUCIBLE.md); None: on for a lossless backend
    compile: bool = False  # the decode step as compiled graphs (compiled_step/), kept on the model; failing: eager
    pin_width: Optional[int] = None  # same-image mode: every target forward at this width; None: the device's mode
    threads: Union[None, str, int] = None  # this call's CPU threads: None torch's, "auto" the free cores, or a number
    profile: bool = False  # every step synchronised and timed (also on CUDA)
    preview: object = None  # a PartialImage (or due() and __call__(seq, done, at_step)): sees steps, changes no token

    def __post_init__(self):  # every field but pin_width (the engine's, which knows the backend's widest forward)
        for name in ("compile", "profile"):
            Param(name, False, "").check(getattr(self, name))  # "compile must be True or False, got ..."
        if self.reproducible is not None and not isinstance(self.reproducible, bool):
            raise ValueError(f"reproducible must be True, False or None (the default: True for a lossless backend), "
                             f"got {self.reproducible!r}")
        if self.threads not in (None, "auto") and not (type(self.threads) is int and self.threads >= 1):
            raise ValueError(f"threads must be None (torch's setting), 'auto' (the cores other processes leave free) "
                             f"or an int >= 1, got {self.threads!r}")


def _typed(value, kind, name, left_out=None):
    """`value` as `kind`: itself, or made from a dict of its fields (one left out: `left_out`'s, else the default)."""
    if isinstance(value, kind):
        return value
    names = [f.name for f in fields(kind)]
    if not isinstance(value, (dict, type(None))) or set(value or {}) - set(names):
        raise ValueError(f"{name} must be a {kind.__name__} or a dict of its fields ({', '.join(names)}), got "
                         f"{value!r}")
    return kind(**{**(left_out or {}), **(value or {})})


def migration(removed: dict, backend) -> str:
    """What to write instead of keywords generate no longer takes: sampling, run options, backend parameters."""
    name = backend.name if isinstance(backend, BackendConfig) else backend
    groups = {"sampling=dict(": [f.name for f in fields(SamplingParams)],
              "options=RunOptions(": [f.name for f in fields(RunOptions)],
              f"backend=make_backend({name!r}, ": ["preset"] + [p.name for m in SCHEMAS.values() for p in m.params]}
    unknown = [k for k in removed if not any(k in names for names in groups.values())]
    if unknown:
        params = [p for p in inspect.signature(generate).parameters if p != "removed"]
        return f"generate() has no parameter {', '.join(unknown)}; its parameters are: {', '.join(params)}"
    parts = [head + ", ".join(f"{k}={v!r}" for k, v in removed.items() if k in names) + ")"
             for head, names in groups.items() if set(names) & set(removed)]
    return (f"generate() takes no {', '.join(f'{k}=' for k in removed)} any more: write {', '.join(parts)} "
            f"(RunOptions and make_backend are specar's)")


def generate(model: ARImageModel, prompt, backend=DEFAULT_BACKEND, seed: int = 0,
             sampling: Union[SamplingParams, dict, None] = None, negative_prompt: str = "", batch_size: int = 1,
             images=None, progress: Optional[Callable[[int, int], None]] = None,
             interrupt: Optional[Callable[[], bool]] = None, options: Union[RunOptions, dict, None] = None,
             **removed) -> GenerationResult:
    """Generate image tokens (and the decoded image) with the chosen backend (the README's "Python API" section).

    ``backend``: a name (its default parameters) or `make_backend(name, **params)`'s validated value. ``sampling``: a
    dict of `SamplingParams`' fields (one left out, or None: the model's recommended value) or a `SamplingParams`.
    ``options``: a `RunOptions` (or a dict of its fields). ``progress(done_tokens, total_tokens)``: once per step;
    ``interrupt()`` returning True: `GenerationInterrupted` (the model stays usable). ``images``: reference images
    (PIL, or float tensors 0..1 [H, W, C] / [B, H, W, C]) where the model takes them (GLM-Image: 1 or 2). A two-grid
    model (`ARImageModel.preceding_stage`, GLM-Image): both grids from a str prompt, ``preceding`` the first grid's
    result, ``stats`` over both. ``removed``: only to say what to write instead of a keyword of the earlier API.
    """
    if removed:
        raise TypeError(migration(removed, backend))
    if not isinstance(model, ARImageModel):
        raise ValueError(f"model must be an ARImageModel (e.g. from specar.load_model), got {type(model).__name__}")
    if not isinstance(backend, BackendConfig):
        backend = make_backend(backend)
    asked = _typed(sampling, SamplingParams, "sampling", dict.fromkeys(f.name for f in fields(SamplingParams)))
    options = _typed(options, RunOptions, "options")
    # a field asked as None: the model's recommended value, else SamplingParams' default (top_k 0: no top-k)
    recommended = {**asdict(SamplingParams()), **{k: v for k, v in model.default_sampling.items() if v is not None}}
    sampling = SamplingParams(**{k: recommended[k] if v is None else v for k, v in asdict(asked).items()}
                              ).validated(model.geometry.vocab_size)
    Param("seed", 0, "", lo=0, hi=2**64 - 1).check(seed)  # the node's seed and batch_size inputs' check and message
    Param("batch_size", 1, "", lo=1).check(batch_size)
    if isinstance(prompt, str) and not isinstance(negative_prompt, str):
        raise ValueError(f"negative_prompt must be a str, got {type(negative_prompt).__name__}")
    common = dict(backend=backend, sampling=sampling, interrupt=interrupt, options=options)
    with torch_threads(choose_threads(None) if options.threads == "auto" else options.threads):
        if images is not None:
            encoded = reference_prompt(model, prompt, images, negative_prompt)
            return _one_grid(model, encoded, seed, batch_size, progress, **common)
        first = model.preceding_stage() if isinstance(prompt, str) else None
        if first is not None:
            return _after_preceding_stage(first, model, prompt, negative_prompt, seed, batch_size, progress, common)
        encoded = model.encode_prompt(prompt, negative_prompt) if isinstance(prompt, str) else \
            model.check_prompt(prompt)
        return _one_grid(model, encoded, seed, batch_size, progress, **common)


def _one_grid(model, encoded, seed, batch, progress, backend, sampling, interrupt, options) -> GenerationResult:
    """One grid: the engine's run from the encoded prompt, its tokens and the decoded images."""
    engine = SpeculativeEngine(model, backend, sampling, seed, batch, profile=options.profile, compile=options.compile,
                               reproducible=options.reproducible, pin_width=options.pin_width)
    with torch.inference_mode():
        seq, stats = engine.run(encoded, progress=progress, interrupt=interrupt, preview=options.preview)
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


def _after_preceding_stage(first, model, prompt, negative_prompt, seed, batch, progress, common):
    """A two-grid model (`ARImageModel.preceding_stage`): the preceding stage's grids (the batch, `seed`), then
    each image's grid after its own codes (one run per image, `stage_seed`: each prompt ends with that image's
    codes). One progress bar over both grids; the live preview (built for `model`'s grid) shows the first grid, then
    the second (`preview.for_stage`, where the preview has it)."""
    n_first, n = first.geometry.seq_len, model.geometry.seq_len
    total = batch * (n_first + n)

    def spanning(offset):
        return None if progress is None else (lambda done, _: progress(offset + done, total))

    preview = common["options"].preview
    first_preview = preview.for_stage(first) if hasattr(preview, "for_stage") else None
    head = _one_grid(first, first.encode_prompt(prompt, negative_prompt), seed, batch, spanning(0),
                     **{**common, "options": replace(common["options"], preview=first_preview)})
    codes = head.tokens.reshape(batch, -1)
    rows = [_one_grid(model, model.prompt_after(prompt, codes[b], negative_prompt), stage_seed(seed, b), 1,
                      spanning(batch * n_first + b * n), **common) for b in range(batch)]
    images = [r.image for r in rows] if rows[0].images else None
    return GenerationResult(
        tokens=rows[0].tokens if batch == 1 else torch.stack([r.tokens for r in rows]),
        image=rows[0].image, images=images, stats=chained_stats(head.stats, [r.stats for r in rows]),
        sequence=torch.cat([r.sequence for r in rows]), preceding=head, prompt=rows[0].prompt)


__all__ = ["GenerationResult", "REPRODUCIBLE_DEFAULT", "RunOptions", "generate", "stage_seed"]
