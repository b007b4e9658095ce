"""The model loader node's side: ComfyUI's model folders, the cached model behind a `ModelHandle`, and ComfyUI's
model management reaching it (Unload Models, memory pressure). ComfyUI's modules come through `comfy_module`,
guarded, so this module imports and runs without ComfyUI."""
from __future__ import annotations

import gc
import importlib
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
_said: set = set()  # what the console was told once (the lists are read on every node definition request and prompt)
_cache: dict = {}  # the loader's values (a tuple of items) -> the loaded model; one model at a time
MAX_LISTED = 20  # a refusal lists at most this many allowed values, else it says the family's rule


# ComfyUI's model folders

def say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        log.info(text)


def comfy_module(name: str):
    """A ComfyUI module ("folder_paths", "comfy.model_management", ...), or None outside ComfyUI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def comfy_server():
    """ComfyUI's running PromptServer, or None."""
    return getattr(getattr(comfy_module("server"), "PromptServer", None), "instance", None)


def register_model_folder() -> None:
    """Register ComfyUI/models/specar (models) and models/specar_drafters (Hawk heads, EAGLE drafters)
    with folder_paths (extra_model_paths.yaml may add more paths)."""
    fp = comfy_module("folder_paths")
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
    fp = comfy_module("folder_paths")
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


def _recognised(candidates, what: str) -> list:
    """The names of the (name, path) candidates whose files a model family recognises; the console says once why
    each other one is skipped."""
    names = []
    for name, path in candidates:
        try:
            detect_family(path)
        except (ValueError, OSError) as e:
            say_once(f"SpecAR: skipping {what.format(name=name, path=path)}: {e}")
            continue
        names.append(name)
    return names


def model_folders() -> list:
    """Sub-folders of the models/specar paths that a model family recognises."""
    return _recognised(((d, path) for d, path in _subfolders(FOLDER) if d not in BUILTIN_MODELS), "{path}")


def cached_model_ids() -> list:
    """Repo ids ('org/name') of the checkpoints in the user's Hugging Face cache that a model family
    recognises (model_loaders/files/hub_cache.py; nothing is downloaded)."""
    return _recognised(cached_models(), "the cached {name}")


def model_choices() -> list:
    folders = model_folders()
    return list(BUILTIN_MODELS) + folders + [r for r in cached_model_ids() if r not in folders]


def resolve_model(name: str) -> str:
    if name in BUILTIN_MODELS:
        return name
    path = dict(_subfolders(FOLDER)).get(name) or find_cached(name)  # models/specar first, then the HF cache
    if path is not None:
        return path
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
                say_once(f"SpecAR: not listing the drafter folder {path}: its {CONFIG_FILE} has format "
                         f"{meta.get('format')!r} (this SpecAR reads {FORMAT}) or its {WEIGHTS_FILE} is missing")
                continue
            names.append(d)
        except (OSError, ValueError, AttributeError):
            continue  # not a drafter folder (or unreadable): not listed; loading it would say why
    return names


def resolve_drafter(name: str, kind: str, input_name: str = "drafter folder") -> str:
    """A drafter folder chosen on the node -> its path ("" = the drafter beside the model)."""
    if name == "":
        return ""
    path = dict(_subfolders(spec.DRAFTER_FOLDER)).get(name)
    if path is not None:
        return path
    if os.path.isabs(name) and os.path.isdir(name):
        return name  # the library's callers (run_sampler) may give a path; ComfyUI accepts only listed names
    raise ValueError(f"{input_name} must be one of {', '.join([spec.BESIDE_MODEL] + drafter_folders(kind))} (the "
                     f"{kind} drafter folders under models/{spec.DRAFTER_FOLDER}); got {name!r}")


def allowed_values(name: str) -> dict:
    """{input: the values the model `name` allows} for the loader inputs that depend on the model: the sizes
    its family offers for this folder, quantization where its loader quantizes, offload where its loader
    offloads. Read from the family (model_loaders/family.py); ValueError when the model is not found."""
    path = resolve_model(name)
    family = family_of(path)
    if family.check is not None:  # a folder missing files is refused naming every one (at queue time)
        family.check(path)
    return {"resolution": [r for r in RESOLUTIONS if _offers(family, path, r)],
            "quantize": list(QUANTIZE_MODES) if family.quantize else ["none"],
            "offload": list(OFFLOADS) if family.offload else ["none"]}


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
            say_once(f"SpecAR: {name}: {e}")
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
                why = str(e)
            if why and len(allowed[name]) > MAX_LISTED:  # the rule, not a list of hundreds of sizes
                return f"{name} {value!r} is not offered for {model}: {why}"
            why = f" ({why})" if why else ""
            return f"{name} {value!r} is not offered for {model}: choose one of {', '.join(allowed[name])}{why}"
    if quantize != "none" and offload != "none":
        return f"quantize {quantize} loads the whole model on the device: choose offload none, or quantize none"
    return None


def loader_spec():
    return spec.loader_spec(model_choices, allowed_by_model)


def sampler_spec():
    return spec.sampler_spec(drafter_folders)


# the cached model

def node_device(choice: str) -> str:
    """The loader's device choice -> a torch device (auto: ComfyUI's device)."""
    if choice == "auto":
        mm = comfy_module("comfy.model_management")
        return str(mm.get_torch_device()) if mm is not None else "cuda" if torch.cuda.is_available() else "cpu"
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
    """What the loader node outputs: the loader's values, not the model, which ComfyUI's output cache would keep
    alive; the model lives in `_cache` (emptied by ComfyUI's model management, hooks below) and `get()` loads it
    again after that (docs/NODES.md, "Nodes": the model cache)."""

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
    """Load a model once and keep it across runs (one model at a time): the new one first, so a failed load keeps
    the working one; only a load out of GPU memory frees the old one first and is tried once more."""
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
    mm = comfy_module("comfy.model_management")
    if _hooked or mm is None:
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
