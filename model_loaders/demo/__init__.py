"""The embedded demo model: procedural data, patch-codebook tokenizer, training and loading."""
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
    return load_demo_model(device=device, dtype=dtype, **options)


FAMILY = ModelFamily(
    name="demo", label="the built-in demo model", files="shipped with SpecAR", load=load, builtin=("demo",),
    sizes="demo its own size", size_options=own_size_only("the built-in model 'demo'"),
    sampling=recommended_sampling())

__all__ = ["FAMILY", "load_demo_model"]
