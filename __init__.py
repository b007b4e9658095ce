"""SpecAR: lossless speculative decoding for autoregressive image models.

This folder is both the Python package ``specar`` (``pip install -e .``) and a ComfyUI custom node
pack (ComfyUI imports this file from ``custom_nodes/``), so every import inside is relative.
"""
from .model_loaders.contract import ARImageModel, EncodedPrompt, ImageGeometry
from .model_loaders.registry import load_model
from .samplers.api import GenerationResult, generate
from .samplers.backends import BACKENDS, SCHEMAS
from .samplers.engine import GenerationInterrupted
from .samplers.stats import GenerationStats

__version__ = "0.1.0"

# ComfyUI entry points (the node module imports ComfyUI lazily, so this works without it)
from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

WEB_DIRECTORY = "./web"

__all__ = [
    "ARImageModel", "BACKENDS", "EncodedPrompt", "GenerationInterrupted", "GenerationResult",
    "GenerationStats", "ImageGeometry", "SCHEMAS", "generate", "load_model",
]
