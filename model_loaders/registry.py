"""`specar.load_model`: one entry point from a name or a folder to an ARImageModel."""
from __future__ import annotations

import importlib
import os

from .checkpoints import read_json_object

# the oldest transformers release whose Janus / Emu3 / Chameleon classes our adapters are tested with
# (`make test-floor` runs the family-loader tests on it); requirements.txt and pyproject.toml say the same
TRANSFORMERS_FLOOR = (4, 56)

# dtype names load_model takes -> the torch dtype name every loader reads; None / "auto": the model's choice
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16", "half": "float16"}


def canonical_dtype(dtype):
    """None for None / "auto", else "float32", "bfloat16" or "float16" (from a name, an alias or a torch
    dtype); ValueError naming the value and the choices for anything else."""
    if dtype is None or dtype == "auto":
        return None
    import torch
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).replace("torch.", "")
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"dtype must be one of auto, float32, bfloat16, float16 (or bf16, fp16, fp32), got {dtype!r}")


def check_device(device) -> None:
    """ValueError for a device torch does not know or a GPU this machine does not have."""
    if device is None or device == "auto":
        return
    import torch
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA GPU is available here (use cpu or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")


# built-in models shipped inside the pack: name -> "module:function" (relative to model_loaders)
BUILTIN_MODELS = {
    "demo": ".demo:load_demo_model",
}


def load_model(name_or_path: str, device=None, dtype=None, **options):
    """Load a built-in model by name (``"demo"``) or a model folder by path.

    Folders in transformers format are recognised from their config.json: Janus / Janus-Pro
    (``model_type: janus``), Emu3 (``emu3``) and Chameleon-family models, Lumina-mGPT and Anole
    (``chameleon``). Options for those: ``device_map``, ``max_memory``, ``offload_folder``
    (accelerate big-model loading), ``attn_implementation``; Emu3 also takes ``image_area`` and
    ``ratio``; Chameleon takes ``layout`` (``lumina`` / ``anole``), ``resolution`` and
    ``target_size``. A LlamaGen folder (the authors' ``c2i_*.pt`` / ``t2i_*.pt`` and
    ``vq_ds16_*.pt`` checkpoints, no config.json) is recognised from its file names (docs/MODELS.md).
    Local files only: nothing is downloaded.
    """
    if not isinstance(name_or_path, str):
        raise ValueError(f"load_model takes a built-in name ({', '.join(BUILTIN_MODELS)}) or a folder path, "
                         f"got {type(name_or_path).__name__}")
    check_device(device)
    dtype = canonical_dtype(dtype)
    if name_or_path in BUILTIN_MODELS:
        module, fn = BUILTIN_MODELS[name_or_path].split(":")
        try:
            loader = getattr(importlib.import_module(module, __package__), fn)
        except ImportError as e:
            raise ValueError(f"built-in model {name_or_path!r} is not available in this installation: {e}") from e
        return loader(device=device, dtype=dtype, **options)
    if not os.path.isdir(name_or_path):
        raise ValueError(f"{name_or_path!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor a folder")
    family = detect_family(name_or_path)
    if family in TRANSFORMERS_FAMILIES:
        require_transformers(family)
    module, fn = FAMILIES[family].split(":")
    try:
        loader = getattr(importlib.import_module(module, __package__), fn)
    except ImportError as e:
        raise ValueError(f"the {family} adapter needs a transformers version that implements it: {e}") from e
    return loader(name_or_path, device=device, dtype=dtype, **options)


# model folders: family -> "module:function"; the family comes from config.json's model_type
FAMILIES = {
    "janus": ".janus:load_janus",
    "emu3": ".emu3:load_emu3",
    "chameleon": ".chameleon:load_chameleon",  # Lumina-mGPT and Anole (two layouts)
    "llamagen": ".llamagen:load_llamagen",  # the authors' .pt checkpoints, no config.json
}
TRANSFORMERS_FAMILIES = ("janus", "emu3", "chameleon")  # the adapters over transformers' model classes


def transformers_version() -> tuple:
    """(major, minor) of the installed transformers, (0, 0) when it is missing."""
    try:
        import transformers
    except ImportError:
        return (0, 0)
    parts = (transformers.__version__.split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


def require_transformers(family: str) -> None:
    """One clear line when the installed transformers is older than the adapters need."""
    have = transformers_version()
    if have < TRANSFORMERS_FLOOR:
        import importlib.util
        floor = ".".join(map(str, TRANSFORMERS_FLOOR))
        installed = "not installed" if importlib.util.find_spec("transformers") is None else \
            f"you have {__import__('transformers').__version__}"
        raise ValueError(f"{family} models need transformers >= {floor}, {installed}: pip install -U "
                         f"\"transformers>={floor}\" (in ComfyUI's Python environment)")


# checkpoints in their authors' original (remote-code) format: what to use instead
_ORIGINAL_FORMATS = {
    "multi_modality": "Janus / Janus-Pro in DeepSeek's original format needs trust_remote_code; use the transformers "
                      "conversion instead (deepseek-community/Janus-Pro-1B or deepseek-community/Janus-Pro-7B)",
}


def read_config(folder: str) -> dict:
    """A model folder's config.json as a dict; a clear ValueError when missing or malformed."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path) and _is_llamagen(folder):
        return "llamagen"
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: a transformers model folder needs its config.json")
    return read_json_object(path)


def detect_family(folder: str) -> str:
    """The model family of a folder, from its config.json (``model_type``, ``architectures``)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path) and _is_llamagen(folder):
        return "llamagen"
    if not os.path.isfile(path):
        raise ValueError(f"no supported model family recognised in folder {folder!r}: it has no config.json "
                         f"(supported: {', '.join(FAMILIES)} folders in transformers format, or the built-in "
                         f"models {', '.join(BUILTIN_MODELS)})")
    cfg = read_config(folder)
    model_type = str(cfg.get("model_type", ""))
    archs = cfg.get("architectures") or []
    if model_type in _ORIGINAL_FORMATS:
        raise ValueError(f"{path}: model_type {model_type!r}: {_ORIGINAL_FORMATS[model_type]}")
    if model_type == "Emu3":
        raise ValueError(f"{path}: this is Emu3 in BAAI's original format (trust_remote_code); use the transformers "
                         f"conversion instead (BAAI/Emu3-Gen-hf)")
    if model_type in FAMILIES:
        return model_type
    for family, arch in (("janus", "JanusForConditionalGeneration"), ("emu3", "Emu3ForConditionalGeneration"),
                         ("chameleon", "ChameleonForConditionalGeneration"),
                         ("chameleon", "ChameleonXLLMXForConditionalGeneration")):
        if arch in archs:
            return family
    raise ValueError(f"no supported model family recognised in folder {folder!r}: {path} has model_type "
                     f"{model_type or '(none)'!r}, architectures {archs or '(none)'}; supported: "
                     f"{', '.join(FAMILIES)} (transformers format) and the built-in models {', '.join(BUILTIN_MODELS)}")


def _is_llamagen(folder: str) -> bool:
    """A LlamaGen folder: the authors' GPT checkpoint (c2i_* / t2i_*) next to their VQ tokenizer (vq_*)."""
    names = os.listdir(folder)
    ext = (".pt", ".pth", ".safetensors")
    return any(n.startswith(("c2i_", "t2i_")) and n.endswith(ext) for n in names) and \
        any(n.startswith("vq_") and n.endswith(ext) for n in names)
