"""The drafter training commands end to end on the demo model (a few images and steps): the files
they write load back and drive their backend, and the CFG branches' features line up with tokens."""
import json
import types

import pytest
import torch

import specar
from specar.cli import train_drafter
from specar.model_loaders.registry import load_model
from specar.training import eagle as eagle_training


@pytest.fixture(scope="module")
def demo():
    torch.set_num_threads(1)
    return load_model("demo")


@pytest.mark.parametrize("kind, backend, param", [("eagle", "adt_tree", "drafter"), ("hawk", "hawk", "heads")])
def test_train_drafter_writes_a_drafter_its_backend_loads(kind, backend, param, demo, tmp_path):
    out = tmp_path / kind
    train_drafter.main(["--kind", kind, "--model", "demo", "--out", str(out), "--images", "2", "--steps", "2",
                        "--batch", "2", "--threads", "1"])
    meta = json.loads((out / "drafter.json").read_text())
    assert meta["kind"] == kind and meta["training"]["steps"] == 2 and meta["training"]["images"] == 2
    res = specar.generate(demo, "a red circle", backend=backend, seed=0, **{param: str(out)})
    assert res.tokens.shape[-2:] == (16, 16) and res.stats.nfe < 256


def test_distillation_rows_pair_each_cfg_branch_with_its_tokens(demo):
    args = types.SimpleNamespace(images=4, per_prompt=2, prompts=None, seed=0)
    fc, fu, toks, _ = eagle_training.distill_features(demo, args, log=open("/dev/null", "w"))
    feats, rows, _ = eagle_training.collect(demo, args, log=open("/dev/null", "w"))
    assert fu is not None and feats.shape[0] == rows.shape[0] == 2 * fc.shape[0]
    # prompt by prompt: its conditional rows, then its unconditional rows, on the same tokens
    torch.testing.assert_close(feats[0:2], fc[0:2]); torch.testing.assert_close(feats[2:4], fu[0:2])
    torch.testing.assert_close(feats[4:6], fc[2:4]); torch.testing.assert_close(feats[6:8], fu[2:4])
    assert torch.equal(rows[0:2], toks[0:2]) and torch.equal(rows[2:4], toks[0:2]) and torch.equal(rows[6:8], toks[2:4])
