"""Generation size and offload choices as `load_model` options, for any model family: the nodes offer one
`resolution` list and one `offload` list for every model, and each family turns a choice into its own options
(`ModelFamily.size_options`, `ModelFamily.offload`) or refuses it naming the sizes it offers.
``offload="auto"`` is accelerate's big-model loading (``device_map="auto"``: the GPU first, the rest of the decoder
layers in CPU memory, as offload.py plans it), for the families over transformers' model classes and Emu3.5."""
from __future__ import annotations

from .family import MODEL_DEFAULT, size_options
from .registry import FAMILIES, family_of, resolve_checkpoint

# squares for every family; wide and tall sizes for Emu3 (any W x H) and Lumina-mGPT (1024x576 and 576x1024
# at target 768, 1280x768 and 768x1280 at target 1024 are sizes its own crop list offers)
_LISTED_BEFORE = ("256x256", "384x384", "512x512", "720x720", "768x768", "1024x1024", "1024x576", "576x1024",
                  "1024x768", "768x1024", "1280x720", "720x1280", "1280x768", "768x1280")  # kept: saved workflows
# the sizes every family offers (`ModelFamily.resolutions`), after the ones listed before: one list for the loader
RESOLUTIONS = tuple(dict.fromkeys((MODEL_DEFAULT,) + _LISTED_BEFORE +
                                  tuple(r for f in FAMILIES.values() for r in f.resolutions)))
OFFLOADS = ("none", "auto")


def load_options(name_or_path: str, resolution: str = MODEL_DEFAULT, offload: str = "none") -> dict:
    """`load_model` options for a generation size and an offload choice; ValueError names the
    family and what it offers."""
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {', '.join(OFFLOADS)}; got {offload!r}")
    family = family_of(name_or_path)
    name_or_path = resolve_checkpoint(name_or_path)
    options = {}
    if offload == "auto":
        if not family.offload:
            offloading = ", ".join(f.label for f in FAMILIES.values() if f.offload)
            raise ValueError(f"offload 'auto' (accelerate device_map) is offered for {offloading}; {name_or_path!r} "
                             f"is {family.label}: choose offload none")
        options["device_map"] = "auto"
    return {**options, **size_options(family, name_or_path, resolution)}


def sizes_help() -> str:
    """What each family offers, for the loader's help."""
    return "; ".join(f.sizes for f in FAMILIES.values() if not f.builtin)
