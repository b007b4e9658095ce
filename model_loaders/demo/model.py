"""Load the embedded demo model: `specar.load_model("demo")`."""
from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..contract import ImageGeometry
from ..devices import resolve_device
from ..llama_decoder import LlamaConfig, LlamaDecoder
from ..families.llama_adapter import IMAGE_OFFSET, LlamaImageModel
from ..precision.quantize import quantize_module
from .text import VOCAB, word_encoder
from .tokenizer import PatchCodebook

WEIGHTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights", "demo")


def _load(path: str) -> dict:
    if not os.path.isfile(path):
        raise ValueError(f"demo model file {path} is missing: reinstall the pack, or rebuild it from a checkout "
                         f"with `python tooling/train_demo.py`")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"cannot read the weights in {path}: {e} (a damaged or partly copied file? copy it "
                         f"again)") from e


def load_demo_model(device=None, dtype=None, path: str = WEIGHTS, quantize=None) -> LlamaImageModel:
    """``quantize``: "int8" / "int4" weight-only quantization of the decoder's linear layers (precision/quantize.py)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"demo model config {cfg_path} is missing")
    with open(cfg_path) as f:
        meta = json.load(f)
    if meta.get("text_vocab") != VOCAB:
        raise ValueError(f"{cfg_path} was trained with another prompt vocabulary than this code's")
    cfg = LlamaConfig(**meta["llama"])
    decoder = LlamaDecoder(cfg)
    state = _load(os.path.join(path, "model.safetensors"))
    expected = {k: v.shape for k, v in decoder.state_dict().items()}
    got = {k: v.shape for k, v in state.items()}
    if expected != got:
        bad = sorted(set(expected) ^ set(got)) or [k for k in expected if expected[k] != got[k]]
        raise ValueError(f"{path}/model.safetensors does not match config.json (first mismatches: {bad[:3]})")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else (dtype or torch.float32)
    decoder.load_state_dict({k: v.float() for k, v in state.items()})
    quantize_module(decoder.to(dtype=dtype), quantize)  # in CPU memory, as the other families: the device gets codes
    decoder = decoder.to(device=resolve_device(device) if device == "auto" else device or "cpu").eval()
    centroids = _load(os.path.join(path, "codebook.safetensors"))["centroids"]
    if centroids.shape != (meta["codes"], 3 * meta["patch"] ** 2):
        raise ValueError(f"{path}/codebook.safetensors has shape {tuple(centroids.shape)}, config says "
                         f"{meta['codes']} codes of {meta['patch']}x{meta['patch']} RGB patches")
    codebook = PatchCodebook(centroids)

    def decode(grid: torch.Tensor):
        from PIL import Image
        return [Image.fromarray(a) for a in codebook.decode(grid)]

    h, w = meta["grid"]
    model = LlamaImageModel(decoder, ImageGeometry(h, w, meta["codes"]), word_encoder(IMAGE_OFFSET + meta["codes"]),
                            max_prompt_tokens=meta["max_prompt_tokens"], name="demo", decoder_fn=decode)
    model.default_sampling = dict(meta["default_sampling"])
    model.codebook = codebook
    model.folder = path
    return model
