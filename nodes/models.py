"""The model loader node's side: ComfyUI's model folders, the cached model behind a `ModelHandle`, and
ComfyUI's model management reaching it (Unload Models, memory pressure).

ComfyUI modules (`folder_paths`, `comfy.model_management`) are imported lazily and guarded, so this
module imports and runs without ComfyUI.
"""
from __future__ import annotations

import gc
import json
import logging
import os
from typing import Optional

import torch

from ..model_loaders.files.drafter_files import CONFIG_FILE, FORMAT, WEIGHTS_FILE
from ..model_loaders.files.hub_cache import cached_models, find_cached
from ..model_loaders.precision.quantize import QUANTIZE_MODES
from ..model_loaders.registry import BUILTIN_MODELS, detect_family, family_of, load_model
from ..model_loaders.resolutions import MODEL_DEFAULT as MODEL_DEFAULT_SIZE
from ..model_loaders.resolutions import OFFLOADS, RESOLUTIONS, load_options
from . import spec
from .widgets import validate

log = logging.getLogger("specar")
FOLDER = "specar"  # ComfyUI/models/specar/<model folder>
_said: set = set()  # drafter folders the console was told are not listed
_cache: dict = {}  # the loader's values (a tuple of items) -> the loaded model; one model at a time


# ---------------------------------------------------------------------------------------------
# ComfyUI's model folders

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
        log.warning("SpecAR: cannot read the %s model folders: %s", folder, e)
        return []


def _subfolders(folder: str):
    """(name, path) of the sub-folders of every path of a ComfyUI model folder, first path first."""
    seen = set()
    for base in _model_dirs(folder):
        if not os.path.isdir(base):
            continue
        for d in sorted(os.listdir(base)):
            path = os.path.join(base, d)
            if os.path.isdir(path) and d not in seen:
                seen.add(d)
                yield d, path


def model_folders() -> list:
    """Sub-folders of the models/specar paths that a model family recognises."""
    names = []
    for d, path in _subfolders(FOLDER):
        if d in BUILTIN_MODELS:
            continue
        try:
            detect_family(path)
        except ValueError as e:
            log.info("SpecAR: skipping %s: %s", path, e)
            continue
        names.append(d)
    return names


def cached_model_ids() -> list:
    """Repo ids ('org/name') of the checkpoints in the user's Hugging Face cache that a model family
    recognises (model_loaders/files/hub_cache.py; nothing is downloaded)."""
    ids = []
    for repo_id, snapshot in cached_models():
        try:
            detect_family(snapshot)
        except (ValueError, OSError) as e:
            log.info("SpecAR: skipping the cached %s: %s", repo_id, e)
            continue
        ids.append(repo_id)
    return ids


def model_choices() -> list:
    folders = model_folders()
    return list(BUILTIN_MODELS) + folders + [r for r in cached_model_ids() if r not in folders]


def resolve_model(name: str) -> str:
    if name in BUILTIN_MODELS:
        return name
    for d, path in _subfolders(FOLDER):
        if d == name:
            return path
    snapshot = find_cached(name)  # models/specar first, then the Hugging Face cache
    if snapshot is not None:
        return snapshot
    raise ValueError(f"model {name!r} not found: choose one of {', '.join(model_choices())}")


def drafter_folders(kind: str) -> list:
    """Drafter folders of one kind ("hawk", "eagle") under ComfyUI/models/specar_drafters: those whose
    drafter.json has this kind and the format this SpecAR reads, beside their weights file. Others are not
    listed (the console says why), so ComfyUI refuses them when a prompt is queued."""
    names = []
    for d, path in _subfolders(spec.DRAFTER_FOLDER):
        try:
            with open(os.path.join(path, CONFIG_FILE)) as f:
                meta = json.load(f)
            if meta.get("kind") != kind:
                continue
            if meta.get("format") != FORMAT or not os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
                if path not in _said:  # once per folder: the lists are read on every node definition request
                    _said.add(path)
                    log.info("SpecAR: not listing the drafter folder %s: its %s has format %r (this SpecAR reads "
                             "%s) or its %s is missing", path, CONFIG_FILE, meta.get("format"), FORMAT, WEIGHTS_FILE)
                continue
            names.append(d)
        except (OSError, ValueError, AttributeError):
            continue  # not a drafter folder (or unreadable): not listed; loading it would say why
    return names


def resolve_drafter(name: str, kind: str, input_name: str = "drafter folder") -> str:
    """A drafter folder chosen on the node -> its path ("" = the drafter beside the model)."""
    if name == "":
        return ""
    for d, path in _subfolders(spec.DRAFTER_FOLDER):
        if d == name:
            return path
    if os.path.isabs(name) and os.path.isdir(name):
        return name  # the library's callers (run_sampler) may give a path; ComfyUI accepts only listed names
    raise ValueError(f"{input_name} must be one of {', '.join([spec.BESIDE_MODEL] + drafter_folders(kind))} (the "
                     f"{kind} drafter folders under models/{spec.DRAFTER_FOLDER}); got {name!r}")


def allowed_values(name: str) -> dict:
    """{input: the values the model `name` allows} for the loader inputs that depend on the model: the sizes
    its family offers for this folder, quantization where its loader quantizes, offload for transformers-format
    families. Read from the family (model_loaders/family.py); ValueError when the model is not found."""
    path = resolve_model(name)
    family = family_of(path)
    if family.check is not None:  # a folder missing files is refused naming every one (at queue time)
        family.check(path)
    return {"resolution": [r for r in RESOLUTIONS if _offers(family, path, r)],
            "quantize": list(QUANTIZE_MODES) if family.quantize else ["none"],
            "offload": list(OFFLOADS) if family.transformers else ["none"]}


def _offers(family, path: str, resolution: str) -> bool:
    if resolution == MODEL_DEFAULT_SIZE:
        return True
    w, h = (int(x) for x in resolution.split("x"))
    try:
        family.size_options(path, w, h)
    except (ValueError, OSError):
        return False
    return True


def allowed_by_model() -> dict:
    """{model choice: allowed_values}: what the web extension narrows the loader's lists to."""
    out = {}
    for name in model_choices():
        try:
            out[name] = allowed_values(name)
        except (ValueError, OSError) as e:  # listed but unreadable now: loading it says why
            log.info("SpecAR: %s: %s", name, e)
    return out


def loader_error(model=None, resolution=MODEL_DEFAULT_SIZE, quantize="none", offload="none") -> Optional[str]:
    """The loader's check of the inputs that depend on the chosen model, naming what it allows (None: valid).
    ComfyUI runs it when a prompt is queued (VALIDATE_INPUTS / validate_inputs)."""
    choices = model_choices()
    if model not in choices:
        return f"model must be one of {', '.join(choices)}; got {model!r}"
    try:
        allowed = allowed_values(model)
    except (ValueError, OSError) as e:
        return str(e)
    for name, value in (("resolution", resolution), ("offload", offload), ("quantize", quantize)):
        if value not in allowed[name]:
            why = ""
            try:  # the family's own words (what it generates, what offload is for)
                load_options(resolve_model(model), resolution, offload)
            except ValueError as e:
                why = f" ({e})"
            return f"{name} {value!r} is not offered for {model}: choose one of {', '.join(allowed[name])}{why}"
    if quantize != "none" and offload != "none":
        return f"quantize {quantize} loads the whole model on the device: choose offload none, or quantize none"
    return None


def loader_spec():
    return spec.loader_spec(model_choices, allowed_by_model)


def sampler_spec():
    return spec.sampler_spec(drafter_folders)


# ---------------------------------------------------------------------------------------------
# the cached model

def node_device(choice: str) -> str:
    """The loader's device choice -> a torch device (auto: ComfyUI's device)."""
    if choice == "auto":
        try:
            import comfy.model_management as mm
            return str(mm.get_torch_device())
        except ImportError:
            return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was chosen but no CUDA GPU is available; choose cpu or auto")
    return choice


def loader_values(values: dict) -> dict:
    """Every loader input's value, in the loader's input order: the given ones, else the input's default
    (API prompts saved before an input existed leave it out)."""
    inputs = spec.loader_spec(list).inputs  # names and defaults: no need to list the models
    unknown = set(values) - {w.name for w in inputs}
    if unknown:
        raise ValueError(f"not inputs of the SpecAR Model Loader: {', '.join(sorted(unknown))}")
    return {w.name: values.get(w.name, w.default) for w in inputs}


class ModelHandle:
    """What the loader node outputs: which model to use (the loader's values), not the model itself.

    ComfyUI keeps node outputs in its execution cache; were that the model, freeing ours could not
    release its memory. The handle keeps only the values: the model lives in `_cache`, which ComfyUI's
    "Unload Models" and memory pressure empty (hooks below), and `get()` loads it again
    transparently on the next run."""

    def __init__(self, **values):
        self.values = loader_values(values)

    def get(self):
        return load_cached(**self.values)

    def __repr__(self):
        rest = ", ".join(f"{k} {v}" for k, v in self.values.items() if k != "model")
        return f"SpecAR model {self.values['model']} ({rest})"


def load_handle(**values) -> ModelHandle:
    """The loader node: load now (errors show on the loader), output the handle."""
    handle = ModelHandle(**values)
    handle.get()
    return handle


def resolve(model):
    """The model behind a loader output (a ModelHandle) or a model given directly."""
    return model.get() if isinstance(model, ModelHandle) else model


def load_cached(**values):
    """Load a model once and keep it across runs (one model at a time). The new model is loaded
    before the old one is freed, so a failed load (a bad folder, cuda without a GPU) leaves the
    working model in place; only when loading runs out of GPU memory is the old one freed first
    and the load tried once more."""
    values = loader_values(values)
    key = tuple(values.items())
    if key not in _cache:
        err = validate(spec.loader_spec(model_choices).inputs, values) or loader_error(
            values["model"], values["resolution"], values["quantize"], values["offload"])
        if err:
            raise ValueError(err)
        _install_hooks()
        path = resolve_model(values["model"])
        options = load_options(path, values["resolution"], values["offload"])
        if values["quantize"] != "none":
            options["quantize"] = values["quantize"]
        dtype = None if values["dtype"] == "auto" else values["dtype"]

        def load():
            return load_model(path, device=node_device(values["device"]), dtype=dtype, **options)
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
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


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
            if short and str(device) in {str(getattr(m, "device", "cpu")) for m in _cache.values()}:
                log.info("SpecAR: freeing the cached model for %s (memory pressure on %s)", list(_cache), device)
                free_models()
            return out

        free_memory.specar_original = original_free
        mm.free_memory = free_memory
    _hooked.append(original_unload)


__all__ = ["ModelHandle", "allowed_by_model", "allowed_values", "drafter_folders", "free_models", "load_cached",
           "load_handle", "loader_error", "model_choices",
           "register_model_folder", "resolve", "resolve_drafter"]
