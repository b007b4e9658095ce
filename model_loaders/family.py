"""What a model family declares, once: `ModelFamily` (docs/MODELS.md, "One object per family": each family module
ends with one, registry.py lists them, and `load_model`, resolutions.py and the nodes read nothing else)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Optional

from .files.checkpoints import read_json_object


MODEL_DEFAULT = "model default"  # the size a checkpoint generates unless asked otherwise


def parse_size(resolution: str):
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", resolution) if isinstance(resolution, str) else None
    if m is None:
        raise ValueError(f"resolution must be {MODEL_DEFAULT!r} or 'WxH' in pixels (e.g. '768x768'), got "
                         f"{resolution!r}")
    return int(m.group(1)), int(m.group(2))


def size_options(family, name_or_path: str, resolution: str = MODEL_DEFAULT) -> dict:
    """The family's own `load_model` options for a "WxH" size (none for the model's default); ValueError naming
    what it offers."""
    if resolution == MODEL_DEFAULT:
        return {}
    w, h = parse_size(resolution)
    return family.size_options(name_or_path, w, h)


@dataclass(frozen=True)
class Sampling:
    """A variant's recommended classifier-free guidance scale and top-k (None: no top-k), and temperature and top-p
    where it recommends other than 1.0."""
    variant: str  # "Janus-Pro", "LlamaGen c2i": what the help calls it
    cfg_scale: float
    top_k: Optional[int]
    temperature: float = 1.0
    top_p: float = 1.0

    def for_vocab(self, vocab_size: int) -> dict:
        """The `default_sampling` of a loaded model: top-k at most its image vocabulary."""
        out = {"cfg_scale": self.cfg_scale, "top_k": 0 if self.top_k is None else min(self.top_k, vocab_size)}
        return {**out, **{k: getattr(self, k) for k in ("temperature", "top_p") if getattr(self, k) != 1.0}}

    def describe(self) -> str:
        extra = "".join(f", {k.replace('_', '-')} {getattr(self, k):g}" for k in ("temperature", "top_p")
                        if getattr(self, k) != 1.0)
        return f"{self.variant}: cfg {self.cfg_scale:g}, top-k {self.top_k or 'off'}{extra}"


def square_size(label: str, sizes: str) -> Callable[[str, int, int], dict]:
    """`size_options` of a family that generates squares given as ``image_size``."""
    def options(folder: str, w: int, h: int) -> dict:
        if w != h:
            raise ValueError(f"{label} generates square images ({sizes}); got resolution '{w}x{h}'")
        return {"image_size": w}
    return options


def choose_square_size(label: str, sizes) -> Callable[[str, int, int], dict]:
    """`size_options` of a family that generates the squares `sizes` (pixels) given as ``image_size``;
    any other size is refused naming them."""
    def options(folder: str, w: int, h: int) -> dict:
        if w != h or w not in sizes:
            shown = ", ".join(f"{s}x{s}" for s in sizes)
            raise ValueError(f"{label} generates the square sizes {shown}; got resolution '{w}x{h}'")
        return {"image_size": w}
    return options


def own_size_only(what: str) -> Callable[[str, int, int], dict]:
    def options(folder: str, w: int, h: int) -> dict:
        raise ValueError(f"{what} generates at its own size only: choose resolution 'model default'")
    return options


@dataclass(frozen=True)
class ModelFamily:
    name: str  # "janus": detect_family's answer, the adapters' `family`
    label: str  # "Janus / Janus-Pro": what the help and the errors call it
    files: str  # what a folder of this family holds, for the loader's help ("transformers format")
    load: Callable  # (folder or built-in name, device=, dtype=, **options) -> ARImageModel
    sizes: str  # the generation sizes it offers, in words ("Emu3 any W x H")
    size_options: Callable[[str, int, int], dict]  # (folder, width, height) -> load options; ValueError naming
    # the sizes it offers
    sampling: tuple = ()  # Sampling per variant: what "model default" guidance uses
    # (folder, its config.json or None when it has none) -> whether the folder is this family; may raise a
    # ValueError for a format of this family that SpecAR does not load (naming what to use instead)
    detect: Optional[Callable[[str, Optional[dict]], bool]] = None
    builtin: tuple = ()  # names of built-in models (shipped with the pack, no folder)
    transformers: bool = False  # an adapter over transformers' classes: needs TRANSFORMERS_FLOOR
    offload: bool = False  # its loader takes device_map="auto" (accelerate; transformers' or offload.py)
    resolutions: tuple = ()  # the "WxH" sizes its checkpoints generate, for the loader's resolution list
    quantize: bool = False  # its loader takes quantize="int8" / "int4" (weight-only, precision/quantize.py)
    # (folder) -> None, or a ValueError naming every file the folder lacks: run when the loader node lists or
    # queues the folder (None: the family's loader says what is missing)
    check: Optional[Callable[[str], None]] = None


def read_config(folder: str) -> dict:
    """A model folder's config.json as a dict; a clear ValueError when missing or malformed."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: a transformers model folder needs its config.json")
    return read_json_object(path)


def config_names(config: Optional[dict]) -> tuple:
    """(model_type, architectures) of a config.json (empty when there is none)."""
    if config is None:
        return "", []
    return str(config.get("model_type", "")), list(config.get("architectures") or [])
