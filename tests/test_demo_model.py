"""The embedded demo model: shipped weights, loading, corruption (its data, codebook and prompt judge, maintainer
tooling: tooling/tests/test_demo_data.py, tooling/tests/test_demo_judge.py)."""
import json
import os
import shutil

import pytest
import torch

import specar
from specar.model_loaders.demo.model import WEIGHTS, load_demo_model


@pytest.fixture(scope="module")
def demo():
    return specar.load_model("demo")


def test_generate_with_the_demo_model(demo):
    assert demo.geometry.height == 16 and demo.geometry.width == 16 and demo.geometry.vocab_size == 1024
    for backend in ("ar", "sjd_pac"):
        res = specar.generate(demo, "a red circle on a blue background", backend=backend, seed=0)
        assert res.tokens.shape == (16, 16)
        assert res.image.size == (64, 64) and res.image.mode == "RGB"
    # unknown words are fine
    specar.generate(demo, "zebra quantum", backend="ar", seed=0)


def test_corrupt_or_mismatched_files_are_reported(tmp_path):
    bad = tmp_path / "demo"
    shutil.copytree(WEIGHTS, bad)
    with open(bad / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ValueError, match="corrupt"):
        load_demo_model(path=str(bad))
    shutil.copy(os.path.join(WEIGHTS, "model.safetensors"), bad / "model.safetensors")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["llama"]["hidden_size"] += cfg["llama"]["num_heads"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="does not match"):
        load_demo_model(path=str(bad))
    (bad / "codebook.safetensors").unlink()
    shutil.copy(os.path.join(WEIGHTS, "config.json"), bad / "config.json")
    with pytest.raises(ValueError, match="missing"):
        load_demo_model(path=str(bad))


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu():
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model("demo", device="auto").device.type == want.type
