"""Hawk (spatial draft heads + speculation cache): exactness, a planted bug, greedy, head files,
the node budget.

Exactness follows tests/test_exactness.py (cases from tests/support/exactness.py): 16000 images in one batched generation on a
tiny model (random-weight heads, no files), Pearson chi-square against the teacher-forced
enumeration of every image; a case fails when p < P_FAIL = 1e-6.
"""
import json
import os

import pytest
import torch

import specar
from specar.model_loaders.files.drafter_files import save_drafter
from specar.samplers.drafters.hawk.drafter import HawkDrafter
from specar.samplers.drafters.hawk.network import HawkConfig, load_heads, random_heads
from support.exactness import check_exact as sample_and_test
from support.exactness import EXACTNESS_MODELS, exactness_model, greedy_and_argmax, mark_long, tiny_model, use_drafter

P_FAIL = 1e-6
MODELS = EXACTNESS_MODELS
model = exactness_model


def check_exact(model_name, setting, **params):
    return sample_and_test("hawk", model_name, setting, **params)


CASES = [
    ("v3-2x2", "plain", dict(vertical_depth=1, candidates=2, node_budget=12)),
    ("v3-2x2", "cfg", dict(vertical_depth=1, horizontal_heads=3, candidates=1, node_budget=6)),
    ("v3-2x3-rowend", "plain", dict(vertical_depth=1, node_budget=10)),
    ("v3-2x3-rowend", "cfg", dict(vertical_depth=2, horizontal_heads=5, candidates=2, node_budget=16)),
    ("v4-2x2", "t07-topk", dict(vertical_depth=0, candidates=3, node_budget=8)),
    ("v3-2x3-rowend", "mixed", dict(vertical_depth=1, horizontal_heads=2, candidates=1, node_budget=4)),
    ("v3-2x3-rowend", "plain", dict(vertical_depth=1, horizontal_heads=1, vertical_reach=4, chain_prior=0.9,
                                    node_budget=9)),
    ("v4-2x2", "cfg", dict(vertical_depth=2, horizontal_heads=1, vertical_reach=2, candidates=2, node_budget=12)),
]


# `make test` runs these cases (row ends, vertical heads of depth 1-2, CFG, top-k), `make test-long` the others
# (pytest.mark.long)
QUICK_CASES = (4, 6, 7)


@pytest.mark.parametrize("case", mark_long(CASES, QUICK_CASES), ids=lambda c: "-".join([c[0], c[1]] + [f"{k}={v}" for k, v in c[2].items()]))
def test_hawk_is_exact(case):
    m, s, params = case
    (p_value, stat, dof, tv), res = check_exact(m, s, **params)
    print(f"\n{m} {s} {params}: p={p_value:.3g} chi2={stat:.1f} dof={dof} TV={tv:.4f} "
          f"compression={res.stats.step_compression:.3f} mean_acc={res.stats.mean_accepted_length:.3f}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert not res.stats.lossy
    assert res.stats.step_compression > 1.0


def test_vertical_candidates_are_used(monkeypatch):
    """The vertical cache is exercised: some accepted drafts come from a vertical head."""
    sources = []  # per step: [B, path] source of each accepted draft (0: horizontal, d: vertical depth d), else -1

    class Collecting(HawkDrafter):
        def observe(self, state, plan, tree, verdict, p, out, previous_frontier):
            n_acc = torch.where(state.active, verdict.n_accepted, 0)
            slot = torch.arange(verdict.path.shape[1], device=state.ctx.device)
            drafted = (slot[None] >= 1) & (slot[None] <= n_acc[:, None]) & state.active[:, None]
            sources.append(torch.where(drafted, tree.source.gather(1, verdict.path), -1).cpu())
            return super().observe(state, plan, tree, verdict, p, out, previous_frontier)

    use_drafter(monkeypatch, "hawk", Collecting)
    specar.generate(model("v3-2x3-rowend"), "hi", backend=specar.make_backend("hawk", vertical_depth=1, node_budget=8),
                    seed=3, batch_size=512)
    src = torch.cat([s.flatten() for s in sources])
    n_h, n_v = int((src == 0).sum()), int((src == 1).sum())
    print(f"\naccepted drafts: horizontal {n_h}, vertical {n_v}")
    assert n_v > 50 and n_h > 50


def test_planted_vertical_q_bug_is_caught(monkeypatch):
    # planted bug: a vertical candidate is verified against the HORIZONTAL head's q
    def horizontal_q(self, pool_q, source):
        B, N, S, V = pool_q.shape
        return pool_q[:, :, 0]

    monkeypatch.setattr(HawkDrafter, "_recorded_q", horizontal_q)
    (p_value, stat, dof, tv), _ = check_exact("v4-2x2", "plain", vertical_depth=1, candidates=1, node_budget=8)
    print(f"\nplanted vertical-q bug: p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"planted bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


@pytest.mark.parametrize("model_name", list(MODELS))
def test_greedy_gives_the_argmax_sequence(model_name):
    mdl = model(model_name)
    tokens, argmax_image, _ = greedy_and_argmax(mdl, "hawk", 64, vertical_depth=1, node_budget=10)
    assert (tokens == argmax_image).all()


def test_node_budget_respected_and_tree_padded():
    mdl = tiny_model(16, (4, 4), seed=3, row_end=True)
    shapes = []
    real = mdl.forward

    def spy(session, tokens, parents):
        shapes.append((tuple(tokens.shape), len(parents)))
        return real(session, tokens, parents)

    mdl.forward = spy
    res = specar.generate(mdl, "a cat",
                          backend=specar.make_backend("hawk", node_budget=7, vertical_depth=2, horizontal_heads=4,
                                                      candidates=3),
                          seed=1, batch_size=3)
    assert set(shapes) == {((3, 7), 7)}, set(shapes)  # one fixed shape every step
    assert res.stats.step_compression >= 1.0
    d = HawkDrafter(specar.samplers.backends.make_backend("hawk", node_budget=300, candidates=1, vertical_depth=0,
                                                          horizontal_heads=2).typed_params, mdl,
                    specar.samplers.target.SamplingParams())
    assert d.n_real == 3 and len(d.parents) == 300  # a chain of 2 drafts, padded with invalid nodes


def test_same_seed_same_tokens():
    mdl = tiny_model(16, (4, 4), seed=3, row_end=True)
    a = specar.generate(mdl, "a cat", backend="hawk", seed=11).tokens
    b = specar.generate(mdl, "a cat", backend="hawk", seed=11).tokens
    assert torch.equal(a, b)


# -- head files ----------------------------------------------------------------------------------
def _with_folder(tmp_path, **kw):
    mdl = tiny_model(4, (2, 2), **kw)
    mdl.folder = str(tmp_path)
    mdl.random_drafter_seed = None
    return mdl


def test_missing_heads_names_the_training_command(tmp_path):
    mdl = _with_folder(tmp_path)
    with pytest.raises(ValueError, match="train-drafter --kind hawk"):
        specar.generate(mdl, "hi", backend="hawk")


def test_heads_from_a_file_and_mismatches(tmp_path):
    mdl = _with_folder(tmp_path)
    folder = os.path.join(str(tmp_path), "hawk_heads")
    cfg = HawkConfig(mdl.hidden_size, 3, 1)
    heads = random_heads(cfg, 5)
    save_drafter(folder, "hawk", mdl, heads.state_dict(), cfg.to_dict(), training={"steps": 0})
    loaded = load_heads(mdl, 2, 1)
    assert torch.equal(loaded.h_weight, heads.h_weight[:2])
    res = specar.generate(mdl, "hi", backend=specar.make_backend("hawk", horizontal_heads=3), seed=2, batch_size=4)
    assert res.tokens.shape == (4, 2, 2)
    with pytest.raises(ValueError, match="horizontal_heads=4"):
        specar.generate(mdl, "hi", backend=specar.make_backend("hawk", horizontal_heads=4))
    # another target: refused by fingerprint
    other = _with_folder(tmp_path, seed=9)
    with pytest.raises(ValueError, match="not for the loaded model"):
        load_heads(other, 2, 1)
    # shapes that disagree with drafter.json
    meta_path = os.path.join(folder, "drafter.json")
    meta = json.load(open(meta_path))
    meta["config"]["vertical_depth"] = 2
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(ValueError, match="does not match"):
        load_heads(mdl, 2, 1)


def test_shipped_demo_heads_load_and_run():
    from specar.model_loaders.registry import load_model
    mdl = load_model("demo")
    heads = load_heads(mdl, 6, 2)  # fingerprint and shapes checked
    assert heads.h_weight.shape == (6, mdl.hidden_size, mdl.hidden_size)
    # node_budget 8, the budget the heads were trained for: the default (0) follows the machine's timings
    res = specar.generate(mdl, "a red circle", backend=specar.make_backend("hawk", node_budget=8), seed=0)
    assert res.stats.step_compression > 2.0, res.stats.step_compression
