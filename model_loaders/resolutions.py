"""Generation size and offload choices as `load_model` options, per model family.

The nodes offer one `resolution` list and one `offload` list for every model; what a family can do
differs, so each choice is turned into that family's own options here, or refused with the sizes
the family offers:

- Janus / Janus-Pro: the checkpoint's own size only (384x384 for Janus-Pro);
- Emu3: any W x H (``image_area`` = W * H pixels, ``ratio`` = W:H), within the model's positions;
- Lumina-mGPT: the sizes its own code offers for target sizes 512 / 768 / 1024 (32-pixel
  patches, aspect ratio at most 4); Anole: 512x512 only (its image tokenizer's resolution);
- LlamaGen: square sizes (``image_size``), multiples of its VQ downsampling;
- built-in models: their own size only.

``offload="auto"`` is accelerate's big-model loading (``device_map="auto"``: the GPU first, the rest
of the weights in CPU memory), for the transformers families.
"""
from __future__ import annotations

import math
import re

from .registry import BUILTIN_MODELS, detect_family, read_config

MODEL_DEFAULT = "model default"
# squares for every family; wide and tall sizes for Emu3 (any W x H) and Lumina-mGPT (1024x576 and 576x1024
# at target 768, 1280x768 and 768x1280 at target 1024 are sizes its own crop list offers)
RESOLUTIONS = (MODEL_DEFAULT, "256x256", "384x384", "512x512", "720x720", "768x768", "1024x1024", "1024x576",
               "576x1024", "1024x768", "768x1024", "1280x720", "720x1280", "1280x768", "768x1280")
OFFLOADS = ("none", "auto")
TRANSFORMERS_FAMILIES = ("janus", "emu3", "chameleon")


def _size(resolution: str):
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", resolution) if isinstance(resolution, str) else None
    if m is None:
        raise ValueError(f"resolution must be {MODEL_DEFAULT!r} or 'WxH' in pixels (e.g. '768x768'), got "
                         f"{resolution!r}")
    return int(m.group(1)), int(m.group(2))


def _lumina(folder: str) -> bool:
    config = read_config(folder)
    return "ChameleonXLLMXForConditionalGeneration" in (config.get("architectures") or [])


def load_options(name_or_path: str, resolution: str = MODEL_DEFAULT, offload: str = "none") -> dict:
    """`load_model` options for a generation size and an offload choice; ValueError names the
    family and what it offers."""
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {', '.join(OFFLOADS)}; got {offload!r}")
    builtin = name_or_path in BUILTIN_MODELS
    family = "built-in" if builtin else detect_family(name_or_path)
    options = {}
    if offload == "auto":
        if family not in TRANSFORMERS_FAMILIES:
            raise ValueError(f"offload 'auto' (accelerate device_map) is for transformers-format models "
                             f"(Janus, Emu3, Lumina-mGPT / Anole); {name_or_path!r} is {family}: choose offload none")
        options["device_map"] = "auto"
    if resolution == MODEL_DEFAULT:
        return options
    w, h = _size(resolution)
    if builtin:
        raise ValueError(f"the built-in model {name_or_path!r} generates at its own size only: choose resolution "
                         f"{MODEL_DEFAULT!r}")
    if family == "janus":
        if w != h:
            raise ValueError(f"Janus generates square images at its checkpoint's size (Janus-Pro: 384x384); got "
                             f"resolution {resolution!r}")
        options["image_size"] = w  # the adapter refuses a size other than the checkpoint's, naming it
    elif family == "emu3":
        g = math.gcd(w, h)
        options.update(image_area=w * h, ratio=f"{w // g}:{h // g}")
    elif family == "chameleon":
        if not _lumina(name_or_path):
            raise ValueError(f"Anole generates 512x512 only (its image tokenizer's resolution); got resolution "
                             f"{resolution!r}: choose {MODEL_DEFAULT!r} or 512x512")
        from .chameleon import lumina_sizes
        for target in (512, 768, 1024):
            if (w, h) in lumina_sizes(target):
                options.update(resolution=f"{w}x{h}", target_size=target)
                break
        else:
            offered = sorted({f"{a}x{b}" for t in (512, 768, 1024) for a, b in lumina_sizes(t)} & set(RESOLUTIONS))
            raise ValueError(f"Lumina-mGPT does not offer {resolution}: of the sizes listed, it offers "
                             f"{', '.join(offered)}")
    elif family == "llamagen":
        if w != h:
            raise ValueError(f"LlamaGen generates square images (256, 384 or 512); got resolution {resolution!r}")
        options["image_size"] = w
    return options


__all__ = ["MODEL_DEFAULT", "OFFLOADS", "RESOLUTIONS", "load_options"]
