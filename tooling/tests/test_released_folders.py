"""The product's loading paths on a folder in a released checkpoint's format (tooling/real_size_builders.py's
LlamaGen at reduced widths): found by repo id in the Hugging Face cache, and quantized before the device."""
import os
import shutil

import torch

import specar
from specar.model_loaders.precision.quantize import QuantLinear
from specar.samplers.api import generate
from specar.tooling.real_size_builders import SPECS, build_folder
from specar import make_backend


def test_load_model_finds_a_real_folder_in_the_cache(tmp_path, monkeypatch):
    # a tiny LlamaGen checkpoint in the cache layout loads by its repo id
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    src = build_folder("llamagen-xl", str(tmp_path / "src"), layers=1, reduced=True, dtype=torch.float32)
    snap = cache / "models--FoundationVision--LlamaGen" / "snapshots" / "r1"
    shutil.copytree(src, snap)
    model = specar.load_model("FoundationVision/LlamaGen", dtype="fp32", n_head=4)  # a width of the reduced test
    assert model.family == "llamagen" and model.folder == str(snap)


def test_family_loader_quantizes_before_the_device(tmp_path):
    folder = build_folder("llamagen-xl", str(tmp_path), layers=1, reduced=True, dtype=torch.float32)
    full = specar.load_model(folder, dtype="fp32", n_head=4)  # n_head: the reduced test's width is no GPT size
    q = specar.load_model(folder, dtype="fp32", quantize="int8", n_head=4)
    assert SPECS["llamagen-xl"].family == "llamagen"
    lins = [m for m in q.torch_module().modules() if isinstance(m, QuantLinear)]
    assert lins and not any(isinstance(m, QuantLinear) for m in full.torch_module().modules())
    res = generate(q, "207", backend=make_backend("sjd", window=4), seed=0)
    assert res.tokens.reshape(-1).numel() == q.geometry.height * q.geometry.width and res.image.size == (64, 64)
    assert os.path.isdir(folder)
