"""The drafter training commands end to end on the demo model (a few images and steps): the files
they write load back and drive their backend, and the CFG branches' features line up with tokens."""
import json
import types

import pytest
import torch

import specar
from specar.cli import call
from specar.model_loaders.registry import load_model
from specar.training import eagle as eagle_training
from support.calls import generate_kwargs


@pytest.fixture(scope="module")
def demo():
    torch.set_num_threads(1)
    return load_model("demo")


@pytest.mark.parametrize("kind, backend, param", [("eagle", "adt_tree", "drafter"), ("hawk", "hawk", "heads")])
def test_train_drafter_writes_a_drafter_its_backend_loads(kind, backend, param, demo, tmp_path):
    out = tmp_path / kind
    call(["train-drafter", "--kind", kind, "--model", "demo", "--out", str(out), "--images", "2", "--steps", "2",
          "--batch", "2", "--threads", "1"])
    meta = json.loads((out / "drafter.json").read_text())
    assert meta["kind"] == kind and meta["training"]["steps"] == 2 and meta["training"]["images"] == 2
    res = specar.generate(demo, "a red circle", **generate_kwargs(backend=backend, **{param: str(out)}), seed=0)
    assert res.tokens.shape[-2:] == (16, 16) and res.stats.nfe < 256


def test_distillation_rows_pair_each_cfg_branch_with_its_tokens(demo):
    args = types.SimpleNamespace(images=4, per_prompt=2, prompts=None, seed=0)
    fc, fu, toks, _ = eagle_training.distill_features(demo, args, log=open("/dev/null", "w"))
    feats, rows, _ = eagle_training.collect(demo, args, log=open("/dev/null", "w"))
    assert fu is not None and feats.shape[0] == rows.shape[0] == 2 * fc.shape[0]
    # prompt by prompt: its conditional rows, then its unconditional rows, on the same tokens
    torch.testing.assert_close(feats[0:2], fc[0:2])
    torch.testing.assert_close(feats[2:4], fu[0:2])
    torch.testing.assert_close(feats[4:6], fc[2:4])
    torch.testing.assert_close(feats[6:8], fu[2:4])
    assert torch.equal(rows[0:2], toks[0:2]) and torch.equal(rows[2:4], toks[0:2]) and torch.equal(rows[6:8], toks[2:4])


def _regression_run(out, steps, stop=None, schedule="cosine"):
    """A tiny least-squares fit through `training.loop.train` for `steps` steps; with `stop`, as a
    run interrupted after step `stop` and resumed from its checkpoint."""
    from specar.training.loop import train
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    x = torch.linspace(-1, 1, 24).view(8, 3)
    y = x.sum(1, keepdim=True)

    def loss_fn(step):
        if step == stop:
            raise KeyboardInterrupt  # the user stops the run; its last checkpoint is at `stop`
        return ((net(x[step % 8:step % 8 + 1]) - y[step % 8:step % 8 + 1]) ** 2).mean()

    def run(resume):
        return train(net, loss_fn, steps, str(out), 0.05, resume=resume, checkpoint_every=3, schedule=schedule,
                     log=open("/dev/null", "w"))
    if stop is not None:
        with pytest.raises(KeyboardInterrupt):
            run(False)
        stop = None
        with torch.no_grad():  # the resumed run must take its weights from the checkpoint
            net.weight.zero_()
        return net, run(True)
    return net, run(False)


def test_cosine_schedule_is_a_function_of_the_global_step(tmp_path):
    from specar.training.loop import learning_rate
    rates = [learning_rate(1e-3, "cosine", s, 10) for s in range(10)]
    assert rates[0] == 1e-3 and all(a > b for a, b in zip(rates, rates[1:])) and rates[-1] < 0.03e-3
    assert learning_rate(1e-3, "constant", 7, 10) == 1e-3
    with pytest.raises(ValueError, match="'linear'.*constant.*cosine"):
        learning_rate(1e-3, "linear", 0, 10)
    # a run stopped at step 6 and resumed ends with the weights of an uninterrupted run: the rate
    # after resuming follows the global step (a schedule restarted at the resume point would not)
    whole, s1 = _regression_run(tmp_path / "whole", 12)
    resumed, s2 = _regression_run(tmp_path / "resumed", 12, stop=6)
    assert s2["resumed_from"] == 6 and s1["schedule"] == s2["schedule"] == "cosine"
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b)
    constant, _ = _regression_run(tmp_path / "constant", 12, schedule="constant")
    assert not torch.allclose(constant.weight, whole.weight)


@torch.no_grad()  # guided_kl's q keeps its graph for training; none is needed here
def test_guided_kl_reads_each_image_as_its_conditional_row_and_its_own_unconditional_twin(demo):
    from specar.samplers.target import SamplingParams, target_probs
    args = types.SimpleNamespace(images=4, per_prompt=2, prompts=None, seed=0)
    fc, fu, toks, _ = eagle_training.distill_features(demo, args, log=open("/dev/null", "w"))
    feats, rows, _ = eagle_training.collect(demo, args, log=open("/dev/null", "w"))
    idx = eagle_training.paired_rows(torch.arange(4), 2, True)
    torch.testing.assert_close(feats[idx[:4]], fc)
    torch.testing.assert_close(feats[idx[4:]], fu)
    assert torch.equal(rows[idx[:4]], toks) and torch.equal(rows[idx[4:]], toks)
    h = feats[idx][:, 100:140]
    # against the engine's own sampling distribution computed for both sides (no top-k: q is complete)
    sp = SamplingParams(cfg_scale=3.0, top_k=0)
    g = h + 0.05 * torch.randn(h.shape, generator=torch.Generator().manual_seed(0))
    lg = lambda x: demo.image_logits(x).float()
    p, q = target_probs(lg(h[:4]), lg(h[4:]), sp), target_probs(lg(g[:4]), lg(g[4:]), sp)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    kl = eagle_training.guided_kl(lg(h), lg(g), sp)
    torch.testing.assert_close(kl, expected, rtol=1e-4, atol=1e-6)
    assert float(eagle_training.guided_kl(lg(h), lg(h), sp)) < 1e-5
    # a drafter row paired with another image's unconditional row is scored as a wrong guess
    swapped = torch.cat([h[:4], h[4:].roll(1, 0)])
    assert float(eagle_training.guided_kl(lg(h), lg(swapped), sp)) > 100 * float(kl)


def test_guided_fine_tuning_from_init_lowers_the_guided_kl(demo, tmp_path, capsys):
    shipped = demo.folder + "/eagle_drafter"
    common = ["--kind", "eagle", "--model", "demo", "--images", "4", "--batch", "8", "--threads", "1",
              "--init", shipped, "--guided-weight", "1", "--lr", "3e-4"]
    call(["train-drafter"] + common + ["--out", str(tmp_path / "before"), "--steps", "0"])
    call(["train-drafter"] + common + ["--out", str(tmp_path / "after"), "--steps", "8"])
    before = json.loads((tmp_path / "before" / "drafter.json").read_text())["training"]
    after = json.loads((tmp_path / "after" / "drafter.json").read_text())["training"]
    assert after["init"] == shipped and after["guided_weight"] == 1.0
    # step 0 is the shipped drafter itself (same weights, same data): its KL is the reference
    assert after["eval_guided_kl"] < 0.9 * before["eval_guided_kl"], (before, after)
    with pytest.raises(ValueError, match="--intermediate-size 999 conflicts with --init"):
        call(["train-drafter"] + common + ["--out", str(tmp_path / "x"), "--steps", "1", "--intermediate-size", "999"])
    with pytest.raises(SystemExit):  # refused by the argument parser, before torch is imported
        call(["train-drafter"] + common[:-4] + ["--guided-weight", "-1", "--out", str(tmp_path / "y"), "--steps", "1"])
    assert "argument --guided-weight: must be a number >= 0, got '-1'" in capsys.readouterr().err
