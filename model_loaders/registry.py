"""`specar.load_model`: one entry point from a name or a folder to an ARImageModel."""
from __future__ import annotations

import importlib
import os

# built-in models shipped inside the pack: name -> "module:function" (relative to model_loaders)
BUILTIN_MODELS = {
    "demo": ".demo:load_demo_model",
}


def load_model(name_or_path: str, device=None, dtype=None, **options):
    """Load a built-in model by name (``"demo"``) or a model folder by path."""
    if not isinstance(name_or_path, str):
        raise ValueError(f"load_model takes a built-in name ({', '.join(BUILTIN_MODELS)}) or a folder path, "
                         f"got {type(name_or_path).__name__}")
    if name_or_path in BUILTIN_MODELS:
        module, fn = BUILTIN_MODELS[name_or_path].split(":")
        try:
            loader = getattr(importlib.import_module(module, __package__), fn)
        except ImportError as e:
            raise ValueError(f"built-in model {name_or_path!r} is not available in this installation: {e}") from e
        return loader(device=device, dtype=dtype, **options)
    if not os.path.isdir(name_or_path):
        raise ValueError(f"{name_or_path!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a folder")
    raise ValueError(f"no supported model family recognised in folder {name_or_path!r} "
                     f"(supported so far: the built-in models {', '.join(BUILTIN_MODELS)})")
