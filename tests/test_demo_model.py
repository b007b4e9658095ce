"""The embedded demo model: data, tokenizer, shipped weights, loading, corruption, judge."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

import specar
from specar.model_loaders.demo.data import dataset
from specar.tooling.demo_judge import PromptJudge
from specar.model_loaders.demo.model import WEIGHTS, load_demo_model
from specar.model_loaders.demo.tokenizer import psnr


@pytest.fixture(scope="module")
def demo():
    return specar.load_model("demo")


def test_dataset_is_deterministic():
    a, pa, _ = dataset(8, seed=3)
    b, pb, _ = dataset(8, seed=3)
    c, _, _ = dataset(8, seed=4)
    assert np.array_equal(a, b) and pa == pb
    assert not np.array_equal(a, c)
    assert a.shape == (8, 64, 64, 3) and a.dtype == np.uint8


def test_shipped_codebook_reconstructs_held_out_scenes(demo):
    images, _, _ = dataset(64, seed=4242)
    rec = demo.codebook.decode(demo.codebook.encode(images))
    assert psnr(images, rec) > 20.0


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


def test_judge_tells_right_from_wrong_prompts():
    judge = PromptJudge(train_images=1500)
    images, prompts, _ = dataset(120, seed=99)
    right = np.mean([judge.judge(im, p)["ok"] for im, p in zip(images, prompts)])
    wrong = np.mean([judge.judge(im, prompts[(k + 1) % 120])["ok"] for k, im in enumerate(images)])
    assert right > 0.85 and wrong < 0.05
