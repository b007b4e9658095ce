"""`specar.load_model`: one entry point from a name or a folder to an ARImageModel.

The model families are the `FAMILY` objects of the modules in `FAMILY_MODULES` (family.py says what
one declares); adding a family is its module, imported here and named in that tuple.
"""
from __future__ import annotations

import inspect
import os

from . import demo
from .devices import canonical_dtype, check_device
from .families import chameleon, emu3, emu35, glm_image, janus, llamagen, lumina2
from .family import MODEL_DEFAULT, ModelFamily, config_names, read_config, size_options
from .files.hf_files import require_transformers
from .files.hub_cache import find_cached, hub_cache_dir, is_repo_id
from .precision.quantize import check_mode

# the family modules, each ending with `FAMILY = ModelFamily(...)`; detection tries them in this order
# (emu35 before emu3, lumina2 before chameleon)
FAMILY_MODULES = (demo, janus, emu35, emu3, lumina2, chameleon, llamagen, glm_image)
FAMILIES = {m.FAMILY.name: m.FAMILY for m in FAMILY_MODULES}
BUILTIN_MODELS = {name: f for f in FAMILIES.values() for name in f.builtin}  # name -> family


def load_model(name_or_path: str, device=None, dtype=None, quantize=None, **options):
    """Load a built-in model by name (``"demo"``), a model folder by path, or a Hugging Face repo id found in the
    local cache (files/hub_cache.py; nothing is downloaded). The family is recognised from the folder's files
    (docs/MODELS.md, "One object per family"; each family's options: its "Per family"). ``resolution="WxH"`` (every
    family; "model default": its own) becomes the family's size options, or a ValueError naming the sizes it offers;
    the families whose `ModelFamily.offload` is set (transformers families, Emu3.5) also take ``device_map``,
    ``max_memory``, ``offload_folder``; transformers families ``attn_implementation``.
    ``quantize``: ``"int8"`` / ``"int4"`` weight-only quantization of the decoder's linear layers
    (precision/quantize.py; ``None`` / ``"none"``: as stored), for the families whose `ModelFamily.quantize` is set."""
    check_device(device)
    dtype = canonical_dtype(dtype)
    quantize = check_mode(quantize)
    family = family_of(name_or_path)
    name_or_path = resolve_checkpoint(name_or_path)
    if family.transformers:
        require_transformers(family.name)
    if "resolution" in options:  # one name for every family: the families that take no `resolution` get their own
        resolution = options.pop("resolution")
        if "resolution" in inspect.signature(family.load).parameters and resolution != MODEL_DEFAULT:
            options["resolution"] = resolution  # checked by the family's loader
        else:
            options = {**size_options(family, name_or_path, resolution), **options}
    if quantize != "none":
        if not family.quantize:
            offered = ", ".join(f.label for f in FAMILIES.values() if f.quantize)
            raise ValueError(f"quantize={quantize!r}: {family.label} loads unquantized only; quantized loading is "
                             f"offered for {offered}")
        if options.get("device_map") is not None:
            raise ValueError(f"quantize={quantize!r} and device_map={options['device_map']!r} (offload) do not "
                             f"combine: a quantized model is loaded whole on one device; choose one of them")
        options["quantize"] = quantize
    model = family.load(name_or_path, device=device, dtype=dtype, **options)
    model.quantization = quantize  # what the sampler node's statistics name ("none", "int8", "int4")
    return model


def family_of(name_or_path: str) -> ModelFamily:
    """The family of a built-in model name or a model folder; ValueError naming what is supported."""
    if not isinstance(name_or_path, str):
        raise ValueError(f"load_model takes a built-in name ({', '.join(BUILTIN_MODELS)}) or a folder path, "
                         f"got {type(name_or_path).__name__}")
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]
    return FAMILIES[detect_family(resolve_checkpoint(name_or_path))]


def resolve_checkpoint(name_or_path: str) -> str:
    """A built-in name or a folder as given; a Hub repo id ('org/name') that is not a folder -> its
    snapshot in the user's Hugging Face cache (files/hub_cache.py, no network); else a ValueError naming
    what was looked for and where."""
    if name_or_path in BUILTIN_MODELS or os.path.isdir(name_or_path):
        return name_or_path
    if is_repo_id(name_or_path):
        snapshot = find_cached(name_or_path)
        if snapshot is not None:
            return snapshot
        raise ValueError(f"{name_or_path!r} is not a folder, and the Hugging Face cache {hub_cache_dir()!r} has no "
                         f"snapshot of it (models--{name_or_path.replace('/', '--')}/snapshots/); SpecAR downloads "
                         f"nothing: fetch it once with `huggingface-cli download {name_or_path}`, or give a folder")
    raise ValueError(f"{name_or_path!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}), nor a folder, nor "
                     f"a Hugging Face repo id ('org/name') in the local cache")


def detect_family(folder: str) -> str:
    """The model family of a folder, from its config.json (``model_type``, ``architectures``) or, for
    a family without one, its file names."""
    path = os.path.join(folder, "config.json")
    config = read_config(folder) if os.path.isfile(path) else None
    for family in FAMILIES.values():
        if family.detect is not None and family.detect(folder, config):
            return family.name
    supported = (f"{', '.join(f.label + ' (' + f.files + ')' for f in FAMILIES.values() if f.detect)}; built-in "
                 f"names: {', '.join(BUILTIN_MODELS)}")
    if config is None:
        raise ValueError(f"no supported model family recognised in folder {folder!r}: it has no config.json "
                         f"(supported: {supported})")
    model_type, archs = config_names(config)
    raise ValueError(f"no supported model family recognised in folder {folder!r}: {path} has model_type "
                     f"{model_type or '(none)'!r}, architectures {archs or '(none)'}; supported: {supported}")
