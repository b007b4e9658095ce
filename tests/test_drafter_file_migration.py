"""EAGLE drafter files written before the attention band had its own name (drafter.json config key
"window") keep loading; files are now written with "attn_band"."""
from __future__ import annotations

import json
import os

import pytest
import torch

import specar
from specar.model_loaders.files.drafter_files import CONFIG_FILE
from specar.samplers.drafters.eagle import load_eagle
from specar.samplers.drafters.eagle.network import EagleConfig


def test_the_band_is_written_by_its_name_and_the_old_key_still_reads():
    cfg = EagleConfig(hidden_size=16, num_heads=2, attn_band=12)
    assert cfg.to_dict()["attn_band"] == 12 and "window" not in cfg.to_dict()
    old = {k: v for k, v in cfg.to_dict().items() if k != "attn_band"}
    old["window"] = 12
    assert EagleConfig.from_dict(old) == cfg
    with pytest.raises(ValueError, match="both attn_band and its older name window"):
        EagleConfig.from_dict({**old, "attn_band": 12})


def test_a_drafter_folder_with_the_old_key_loads_and_generates_the_same(tmp_path):
    demo = specar.load_model("demo")
    shipped = os.path.join(demo.folder, "eagle_drafter")
    with open(os.path.join(shipped, CONFIG_FILE), encoding="utf-8") as f:
        meta = json.load(f)
    assert "attn_band" in meta["config"] and "window" not in meta["config"]
    old = tmp_path / "old_eagle"
    old.mkdir()
    meta["config"]["window"] = meta["config"].pop("attn_band")
    (old / CONFIG_FILE).write_text(json.dumps(meta))
    os.symlink(os.path.join(shipped, "drafter.safetensors"), old / "drafter.safetensors")
    assert load_eagle(demo, str(old)).cfg == load_eagle(demo, shipped).cfg
    a = specar.generate(demo, "a red circle", backend=specar.make_backend("adt_tree", drafter=str(old)), seed=3)
    b = specar.generate(demo, "a red circle", backend="adt_tree", seed=3)
    assert torch.equal(a.tokens, b.tokens)
