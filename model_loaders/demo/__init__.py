"""The embedded demo model: procedural data, patch-codebook tokenizer and loading (its training:
tooling/train_demo.py)."""
import json
import os

from ..family import ModelFamily, Sampling, own_size_only
from .model import WEIGHTS, load_demo_model


def recommended_sampling(path: str = WEIGHTS) -> tuple:
    """The demo's recommended sampling, from its config.json (what `load_demo_model` sets too)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            s = json.load(f)["default_sampling"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()  # a missing or damaged file: loading the model says which
    return (Sampling("demo", float(s["cfg_scale"]), s["top_k"]),)


def load(name: str, device=None, dtype=None, **options):
    """"demo" (the shipped weights) or a folder in the demo's format (a copy, or a retrained model)."""
    path = WEIGHTS if name == "demo" else name
    return load_demo_model(device=device, dtype=dtype, path=path, **options)


def detect(folder: str, config) -> bool:
    """A folder in the demo's format: its config.json has the decoder's `llama` block and the prompt
    vocabulary (`text_vocab`), which no transformers config has."""
    return isinstance(config, dict) and isinstance(config.get("llama"), dict) and "text_vocab" in config


FAMILY = ModelFamily(
    name="demo", label="the built-in demo model", files="shipped with SpecAR, or a copy of its folder",
    load=load, builtin=("demo",), detect=detect,
    sizes="demo its own size", size_options=own_size_only("the built-in model 'demo'"),
    sampling=recommended_sampling(), quantize=True)

__all__ = ["FAMILY", "load_demo_model"]
