"""SpecAR: lossless speculative decoding for autoregressive image models.

This folder is both the Python package ``specar`` (``pip install -e .``) and a ComfyUI custom node
pack (ComfyUI imports this file from ``custom_nodes/``), so every import inside is relative.

The public names are imported on first use (PEP 562 ``__getattr__``): ``python -m specar --help``
must not wait for torch, and ComfyUI's ``hasattr(module, "NODE_CLASS_MAPPINGS")`` imports the nodes
as before.
"""
import importlib

__version__ = "0.1.0"

WEB_DIRECTORY = "./web"

# public name -> (module, attribute), imported when first asked for
_LAZY = {
    "ARImageModel": (".model_loaders.contract", "ARImageModel"),
    "EncodedPrompt": (".model_loaders.contract", "EncodedPrompt"),
    "ImageGeometry": (".model_loaders.contract", "ImageGeometry"),
    "load_model": (".model_loaders.registry", "load_model"),
    "GenerationResult": (".samplers.api", "GenerationResult"),
    "generate": (".samplers.api", "generate"),
    "RunOptions": (".samplers.api", "RunOptions"),
    "SamplingParams": (".samplers.sampling", "SamplingParams"),
    "make_backend": (".samplers.backends", "make_backend"),
    "BACKENDS": (".samplers.backends", "BACKENDS"),
    "SCHEMAS": (".samplers.backends", "SCHEMAS"),
    "GenerationInterrupted": (".samplers.engine", "GenerationInterrupted"),
    "GenerationStats": (".samplers.stats", "GenerationStats"),
    # ComfyUI entry points (the node module imports ComfyUI lazily, so this works without it)
    "NODE_CLASS_MAPPINGS": (".nodes", "NODE_CLASS_MAPPINGS"),
    "NODE_DISPLAY_NAME_MAPPINGS": (".nodes", "NODE_DISPLAY_NAME_MAPPINGS"),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module, __name__), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ARImageModel", "BACKENDS", "EncodedPrompt", "GenerationInterrupted", "GenerationResult", "GenerationStats",
    "ImageGeometry", "RunOptions", "SCHEMAS", "SamplingParams", "generate", "load_model", "make_backend",
]
