"""What the nodes do, as plain functions shared by the V1 and V3 node classes.

ComfyUI modules (`folder_paths`, `comfy.utils`, `comfy.model_management`) are imported lazily, only
where needed and guarded, so this module (and the whole pack) imports and runs without ComfyUI.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Callable, Optional

import torch

from ..model_loaders.registry import BUILTIN_MODELS, detect_family, load_model
from ..model_loaders.resolutions import MODEL_DEFAULT as MODEL_DEFAULT_SIZE
from ..model_loaders.resolutions import load_options
from ..samplers import backends as _backends
from ..samplers.api import generate
from ..samplers.engine import GenerationInterrupted
from ..samplers.preview import PartialImage
from . import spec

log = logging.getLogger("specar")
FOLDER = "specar"  # ComfyUI/models/specar/<model folder>
_cache: dict = {}
# live preview: at most every 0.25 s and at most ~3% of the elapsed time (samplers/preview.py)
PREVIEW_THROTTLE = {"min_interval_s": 0.25, "share": 0.03}


# ---------------------------------------------------------------------------------------------
# models

def _folder_paths():
    try:
        import folder_paths
    except ImportError:
        return None
    return folder_paths


def register_model_folder() -> None:
    """Register ComfyUI/models/specar (models) and models/specar_drafters (Hawk heads, EAGLE drafters)
    with folder_paths (extra_model_paths.yaml may add more paths)."""
    fp = _folder_paths()
    if fp is None:
        return
    names = getattr(fp, "folder_names_and_paths", None)
    for folder in (FOLDER, spec.DRAFTER_FOLDER):
        default = os.path.join(fp.models_dir, folder)
        if isinstance(names, dict) and folder in names and names[folder][0]:
            if default not in names[folder][0]:
                fp.add_model_folder_path(folder, default)
        else:
            fp.add_model_folder_path(folder, default, is_default=True)


def _model_dirs(folder: str = FOLDER) -> list:
    fp = _folder_paths()
    if fp is None:
        return []
    try:
        register_model_folder()
        return list(fp.get_folder_paths(folder))
    except Exception as e:  # a broken folder setup must not break the node list
        log.warning("SpecAR: cannot read the %s model folders: %s", FOLDER, e)
        return []


def model_folders() -> list:
    """Sub-folders of the models/specar paths whose config.json names a supported family."""
    names = []
    for base in _model_dirs():
        if not os.path.isdir(base):
            continue
        for d in sorted(os.listdir(base)):
            path = os.path.join(base, d)
            if not os.path.isdir(path) or d in names or d in BUILTIN_MODELS:
                continue
            try:
                detect_family(path)
            except ValueError as e:
                log.info("SpecAR: skipping %s: %s", path, e)
                continue
            names.append(d)
    return names


def model_choices() -> list:
    return list(BUILTIN_MODELS) + model_folders()


def resolve_model(name: str) -> str:
    if name in BUILTIN_MODELS:
        return name
    for base in _model_dirs():
        path = os.path.join(base, name)
        if os.path.isdir(path):
            return path
    raise ValueError(f"model {name!r} not found: choose one of {', '.join(model_choices())}")


def resolve_device(choice: str) -> str:
    if choice == "auto":
        try:
            import comfy.model_management as mm
            return str(mm.get_torch_device())
        except ImportError:
            return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was chosen but no CUDA GPU is available; choose cpu or auto")
    return choice


class ModelHandle:
    """What the loader node outputs: which model to use, not the model itself.

    ComfyUI keeps node outputs in its execution cache; were that the model, freeing ours could not
    release its memory. The handle keeps only the key: the model lives in `_cache`, which ComfyUI's
    "Unload Models" and memory pressure empty (hooks below), and `get()` loads it again
    transparently on the next run."""

    def __init__(self, name: str, device: str, dtype: str, resolution: str = MODEL_DEFAULT_SIZE, offload: str = "none"):
        self.name, self.device, self.dtype, self.resolution, self.offload = name, device, dtype, resolution, offload

    @property
    def key(self) -> tuple:
        return (self.name, self.device, self.dtype, self.resolution, self.offload)

    def get(self):
        return load_cached(*self.key)

    def __repr__(self):
        return f"SpecAR model {self.name} ({self.device}, {self.dtype}, {self.resolution}, offload {self.offload})"


def load_handle(name: str, device: str = "auto", dtype: str = "auto", resolution: str = MODEL_DEFAULT_SIZE,
                offload: str = "none") -> ModelHandle:
    """The loader node: load now (errors show on the loader), output the handle."""
    handle = ModelHandle(name, device, dtype, resolution, offload)
    handle.get()
    return handle


def resolve(model):
    """The model behind a loader output (a ModelHandle) or a model given directly."""
    return model.get() if isinstance(model, ModelHandle) else model


def load_cached(name: str, device: str = "auto", dtype: str = "auto", resolution: str = MODEL_DEFAULT_SIZE,
                offload: str = "none"):
    """Load a model once and keep it across runs (one model at a time). The new model is loaded
    before the old one is freed, so a failed load (a bad folder, cuda without a GPU) leaves the
    working model in place; only when loading runs out of GPU memory is the old one freed first
    and the load tried once more."""
    err = spec.validate(spec.loader_spec(model_choices).inputs, {"model": name, "device": device, "dtype": dtype,
                                                                 "resolution": resolution, "offload": offload})
    if err:
        raise ValueError(err)
    key = (name, device, dtype, resolution, offload)
    if key not in _cache:
        _install_hooks()
        path = resolve_model(name)
        options = load_options(path, resolution, offload)
        load = lambda: load_model(path, device=resolve_device(device),  # noqa: E731
                                  dtype=None if dtype == "auto" else dtype, **options)
        try:
            model = load()
        except torch.OutOfMemoryError:
            free_models()
            model = load()
        free_models()
        _cache[key] = model
    return _cache[key]


def free_models() -> None:
    """Drop the cached model (ComfyUI's 'unload models', POST /free and memory pressure reach this
    through the hooks); the next run loads it again."""
    had = bool(_cache)
    _cache.clear()
    if had:
        import gc
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _model_devices() -> set:
    return {str(getattr(m, "device", "cpu")) for m in _cache.values()}


_hooked: list = []


def _install_hooks() -> None:
    """Take part in ComfyUI's model management through its functions (the documented entry points
    other packs use too): `unload_all_models` (the Unload Models button, POST /free) frees our model;
    `free_memory(memory_required, device, ...)`, which ComfyUI calls before it loads any model, frees
    ours when what ComfyUI freed itself left less than it needs on the device our model is on."""
    if _hooked:
        return
    try:
        import comfy.model_management as mm
    except ImportError:
        return
    original_unload = mm.unload_all_models

    def unload_all_models(*args, **kwargs):
        free_models()
        return original_unload(*args, **kwargs)

    unload_all_models.specar_original = original_unload
    mm.unload_all_models = unload_all_models
    original_free = getattr(mm, "free_memory", None)
    if original_free is not None:
        def free_memory(memory_required, device, *args, **kwargs):
            out = original_free(memory_required, device, *args, **kwargs)
            try:
                short = mm.get_free_memory(device) < memory_required
            except Exception:  # a ComfyUI without get_free_memory: do not guess
                short = False
            if short and str(device) in _model_devices():
                log.info("SpecAR: freeing the cached model for %s (memory pressure on %s)", list(_cache), device)
                free_models()
            return out

        free_memory.specar_original = original_free
        mm.free_memory = free_memory
    _hooked.append(original_unload)


def out_of_memory_message(values: dict, model) -> str:
    """What to lower after a CUDA out-of-memory error, for this run's settings."""
    settings = spec.sampler_settings(values)
    sizes = [f"{k}={v}" for k, v in settings.params.items()
             if k in ("window", "tree_width", "node_budget", "horizontal_heads", "candidates", "depth")]
    what = [f"batch_size (now {values.get('batch_size', 1)})"]
    if sizes:
        what.append(f"the {settings.backend} draft size ({', '.join(sizes)})")
    what.append("the resolution, or load the model with offload / a smaller dtype")
    return (f"out of GPU memory while generating with {settings.backend}: lower {'; '.join(what)}. The model "
            f"is still loaded and usable.")


# ---------------------------------------------------------------------------------------------
# ComfyUI progress bar and interrupt

class ComfyProgress:
    """progress(done, total) -> ComfyUI's progress bar (whose every update also checks the interrupt)."""

    PREVIEW_SIZE = 512  # the longest side of a preview image, as ComfyUI's own latent previews

    def __init__(self):
        try:
            import comfy.utils
            self._utils = comfy.utils
        except ImportError:
            self._utils = None
        self.bar = None
        self.last = (0, 1)

    def __call__(self, done: int, total: int) -> None:
        self.last = (done, total)
        if self._utils is None:
            return
        if self.bar is None:
            self.bar = self._utils.ProgressBar(total)
        self.bar.update_absolute(done, total)

    def show(self, images: list, committed: int, total: int) -> None:
        """A preview image on the node (ComfyUI's progress-bar preview: the first image of the batch)."""
        if self._utils is None or self.bar is None or not images:
            return
        # always PREVIEW_SIZE: ComfyUI scales the preview to it (up too), and frontend 1.27 draws a smaller
        # preview at its own size (a 64x64 image would be a 64 px speck on the node)
        self.bar.update_absolute(self.last[0], self.last[1], ("JPEG", images[0], self.PREVIEW_SIZE))


def comfy_interrupt() -> Optional[Callable[[], bool]]:
    try:
        import comfy.model_management as mm
    except ImportError:
        return None
    return mm.processing_interrupted


def raise_comfy_interrupt(exc: BaseException):
    """Turn our GenerationInterrupted into ComfyUI's InterruptProcessingException (flag reset)."""
    try:
        import comfy.model_management as mm
    except ImportError:
        raise exc
    check = getattr(mm, "throw_exception_if_processing_interrupted", None)
    if check is not None:
        check()  # raises and clears the interrupt flag
    raise mm.InterruptProcessingException() from exc


# ---------------------------------------------------------------------------------------------
# sampling

def heatmap(accepted_at_step: list, size: Optional[tuple] = None) -> torch.Tensor:
    """[H, W, 3] float image: each token coloured by how many tokens its step committed
    (dark purple: one, yellow: the longest step), so step boundaries show as colour changes."""
    steps = torch.as_tensor(accepted_at_step, dtype=torch.long)
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
    return img.clamp(0, 1).contiguous()


def pil_to_tensor(images) -> torch.Tensor:
    import numpy as np
    return torch.stack([torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0) for im in images])


def token_totals(stats) -> tuple:
    """(image tokens, forward passes) summed over the images of a batch, each image's forwards counted
    with the prefill (which samples its first token): their ratio is the batch's step compression
    (AR: exactly 1), not a mean of per-image ratios."""
    tokens = stats.image_tokens * stats.batch
    forwards = sum(int(s) + 1 for s in stats.steps) if stats.steps else stats.nfe + 1
    return tokens, forwards


def summary(stats, ar_stats=None) -> str:
    """One line for the node: backend (LOSSY when it is), tokens and forward passes summed over the batch
    against AR's, measured latency, and the wall-clock ratio to an AR run of the same model, prompt,
    seed, batch and guidance measured in the same execution (`ar_stats`; never a run from another
    time or load: step counts are not a speed-up, and old timings are not comparable)."""
    label = _backends.SCHEMAS[stats.backend].label
    if stats.lossy:
        label += " LOSSY (relaxed acceptance: not AR's distribution)"
    tokens, forwards = token_totals(stats)
    images = f"{stats.batch} images, " if stats.batch > 1 else ""
    summed = " summed over the images" if stats.batch > 1 else ""
    if stats.backend == "ar":
        return f"{label}: {images}{tokens} tokens in {forwards} forward passes{summed}, {stats.latency_s:.2f} s"
    text = (f"{label}: {images}{tokens} tokens in {forwards} forward passes{summed} ({tokens / forwards:.1f}x "
            f"fewer than AR), {stats.latency_s:.2f} s")
    if ar_stats is None:
        return text + "; wall-clock speed-up: turn on compare_with_ar to measure AR in the same run"
    ratio = ar_stats.latency_s / max(stats.latency_s, 1e-9)
    if stats.lossy:
        verdict = "not comparable as a speed-up: a lossy run samples another distribution"
    elif ratio >= 1:
        verdict = "faster"
    else:
        verdict = "slower: the extra drafting costs more than it saves on this device"
    return text + f"; {ratio:.2f}x AR's {ar_stats.latency_s:.2f} s measured in this run ({verdict})"


def drafter_folders(kind: str) -> list:
    """Drafter folders of one kind ("hawk", "eagle") under ComfyUI/models/specar_drafters."""
    names = []
    for base in _model_dirs(spec.DRAFTER_FOLDER):
        if not os.path.isdir(base):
            continue
        for d in sorted(os.listdir(base)):
            meta = os.path.join(base, d, "drafter.json")
            try:
                with open(meta) as f:
                    if json.load(f).get("kind") == kind and d not in names:
                        names.append(d)
            except (OSError, ValueError, AttributeError):
                continue  # not a drafter folder (or unreadable): not listed; loading it would say why
    return names


def resolve_drafter(name: str, kind: str) -> str:
    """A drafter folder chosen on the node -> its path ("" = the drafter beside the model)."""
    if name == "":
        return ""
    for base in _model_dirs(spec.DRAFTER_FOLDER):
        path = os.path.join(base, name)
        if os.path.isdir(path):
            return path
    if os.path.isabs(name) and os.path.isdir(name):
        return name  # API prompts may give a path
    raise ValueError(f"drafter folder {name!r} not found under models/{spec.DRAFTER_FOLDER}; choose one of "
                     f"{', '.join([spec.BESIDE_MODEL] + drafter_folders(kind))}")


def sampler_spec():
    return spec.sampler_spec(drafter_folders)


def backend_config(values: dict):
    """(SamplerSettings, BackendConfig) from the sampler's values; ValueError names the bad value
    (ranges, choices, and the checks between parameters, once)."""
    err = spec.validate(sampler_spec().inputs, values)
    if err:
        raise ValueError(err)
    settings = spec.sampler_settings(values)
    schema = _backends.SCHEMAS[settings.backend]
    params = dict(settings.params)
    for p in schema.params:
        if p.folder_of and p.name in params:
            params[p.name] = resolve_drafter(params[p.name], p.folder_of)
    return settings, _backends.make_backend(settings.backend, **params)


def sampler_error(values: dict) -> Optional[str]:
    """The sampler's own validation of its values (None = valid)."""
    try:
        backend_config(values)
    except ValueError as e:
        return str(e)
    return None


def run_sampler(model, values: dict, progress: Optional[Callable] = None, interrupt: Optional[Callable] = None):
    """Generate from the sampler's widget values.

    Returns (IMAGE [B,H,W,C], tokens, stats JSON, heatmap IMAGE [B,H,W,3], summary text)."""
    model = resolve(model)
    settings, config = backend_config(values)
    batch = values.get("batch_size", 1)
    mode = values.get("preview", "image")
    preview = None
    if mode != "off" and hasattr(progress, "show"):  # only where something shows it (ComfyUI's progress bar)
        preview = PartialImage(model, progress.show, overlay=mode == "image + acceptance", **PREVIEW_THROTTLE)
    sampling = dict(seed=values["seed"], cfg_scale=settings.cfg_scale, temperature=float(values.get("temperature", 1.0)),
                    top_k=settings.top_k, top_p=float(values.get("top_p", 1.0)),
                    negative_prompt=values.get("negative_prompt", ""), batch_size=batch, interrupt=interrupt)
    res = generate(model, values["prompt"], backend=settings.backend, progress=progress, preview=preview,
                   **sampling, **config.params())
    ar_stats = None
    if values.get("compare_with_ar") and settings.backend != "ar":
        # after the backend's run, so any first-run cost counts against the backend, never for it
        ar_stats = generate(model, values["prompt"], backend="ar", **sampling).stats
    geo = model.geometry
    grid = res.tokens.reshape(batch, geo.height, geo.width)
    if res.images:
        image = pil_to_tensor(res.images)
    else:  # no decoder: show the codes as grey levels
        codes = grid.float() / max(geo.vocab_size - 1, 1)
        image = codes[..., None].expand(-1, -1, -1, 3).contiguous()
    if preview is not None:  # the finished image, not the last partial one, stays on the node
        from PIL import Image
        progress.show([Image.fromarray((image[0].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy())],
                      progress.last[1], progress.last[1])
    size = tuple(image.shape[1:3])
    heat = torch.stack([heatmap(a, size=size) for a in res.stats.accepted_at_step])
    defaults = getattr(model, "default_sampling", {})
    cfg = settings.cfg_scale if settings.cfg_scale is not None else defaults.get("cfg_scale", 1.0)
    top_k = settings.top_k if settings.top_k is not None else defaults.get("top_k")
    text = summary(res.stats, ar_stats)
    stats = res.stats.to_dict()
    stats["summary"] = text
    stats["tokens_total"], stats["forwards_total"] = token_totals(res.stats)
    if ar_stats is not None:
        stats["ar_latency_s"] = ar_stats.latency_s
        stats["speedup_vs_ar"] = ar_stats.latency_s / max(res.stats.latency_s, 1e-9)
    stats["backend_label"] = _backends.SCHEMAS[settings.backend].label
    stats["model"] = getattr(model, "name", type(model).__name__)
    stats["sampling"] = {"cfg_scale": cfg, "top_k": top_k or "off", "temperature": values.get("temperature", 1.0),
                         "top_p": values.get("top_p", 1.0),
                         "guidance": "model default" if settings.cfg_scale is None else "custom"}
    tokens = {"tokens": grid, "model": model}
    return image, tokens, json.dumps(stats), heat, text


def run_sampler_in_comfy(handle, values: dict):
    """run_sampler with ComfyUI's progress bar, preview and interrupt; returns (outputs tuple, ui dict)."""
    model = resolve(handle)
    try:
        image, tokens, stats, heat, text = run_sampler(model, values, progress=ComfyProgress(),
                                                       interrupt=comfy_interrupt())
    except GenerationInterrupted as e:
        raise_comfy_interrupt(e)
    except torch.OutOfMemoryError as e:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the generation's caches are gone with its frames; the weights stay
        raise RuntimeError(out_of_memory_message(values, model)) from e
    if isinstance(handle, ModelHandle):
        tokens = {**tokens, "model": handle}  # ComfyUI caches outputs: keep the handle, not the model
    return (image, tokens, stats, heat), {"text": [text], "specar_stats": [stats]}


def decode_tokens(tokens) -> torch.Tensor:
    if not isinstance(tokens, dict) or "model" not in tokens or "tokens" not in tokens:
        raise ValueError("tokens must come from the tokens output of a SpecAR Sampler")
    images = resolve(tokens["model"]).decode_tokens(tokens["tokens"])
    if not images:
        raise ValueError("this model has no image decoder")
    return pil_to_tensor(images)


__all__ = ["ModelHandle", "decode_tokens", "free_models", "load_cached", "load_handle", "model_choices", "resolve",
           "run_sampler", "run_sampler_in_comfy"]
