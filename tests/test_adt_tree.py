"""ADT-Tree (EAGLE drafter + adjacency-adaptive dynamic trees): exactness, planted bugs, greedy,
LANTERN's relaxed bound, drafter files.

Exactness follows tests/test_exactness.py (cases from tests/support/exactness.py): N_SAMPLES (16000) images
in one batched generation on a tiny model (random-weight EAGLE layer, no files), Pearson
chi-square against the teacher-forced enumeration of every image; a case fails when
p < P_FAIL = 1e-6.
"""
import json
import os

import pytest
import torch

import specar
from specar.model_loaders.files.drafter_files import save_drafter
from specar.samplers.drafters.adt_tree.drafter import ADTTreeDrafter
from specar.samplers.proposal import SIBLINGS_INDEPENDENT
from specar.samplers.drafters.eagle import EagleConfig, EagleNet, load_eagle
from specar.samplers.verification import rejection as rejection_mod
from support.exactness import (EXACTNESS_MODELS, EXACTNESS_SAMPLES, chi_square_test, exact_distribution, exactness_model,
                            tiny_model)
from support.exactness import check_exact as sample_and_test
from support.exactness import greedy_and_argmax, mark_long, use_drafter
from support.calls import generate_kwargs

N_SAMPLES = EXACTNESS_SAMPLES
P_FAIL = 1e-6
MODELS = EXACTNESS_MODELS
model = exactness_model


def check_exact(model_name, setting, **params):
    return sample_and_test("adt_tree", model_name, setting, **params)


# top-k candidates (EAGLE-2's trees: preset="paper"; the default is sampled, below)
CASES = [
    ("v3-2x2", "plain", dict(node_budget=8)),
    ("v3-2x2", "cfg", dict(node_budget=4, width=2, depth=2)),
    ("v3-2x3-rowend", "plain", dict(node_budget=6)),
    ("v3-2x3-rowend", "cfg", dict(tree_init="above", node_budget=8)),
    ("v4-2x2", "t07-topk", dict(tree_init="random", node_budget=5)),
    ("v3-2x3-rowend", "mixed", dict(adaptive=False, depth=4, width=2, node_budget=7)),
    ("v3-2x2", "cfg", dict(preset="paper")),
]


# `make test` runs the cases QUICK_*, `make test-long` the others (pytest.mark.long)
QUICK_CASES = (0, 2, 4)


@pytest.mark.parametrize("case", mark_long(CASES, QUICK_CASES), ids=lambda c: "-".join([c[0], c[1]] + [f"{k}={v}" for k, v in c[2].items()]))
def test_adt_tree_is_exact(case):
    m, s, params = case
    params = {**params, "candidate_mode": "topk"}
    (p_value, stat, dof, tv), res = check_exact(m, s, **params)
    print(f"\n{m} {s} {params}: p={p_value:.3g} chi2={stat:.1f} dof={dof} TV={tv:.4f} "
          f"compression={res.stats.step_compression:.3f}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert not res.stats.lossy
    assert res.stats.step_compression >= 1.0


# candidate_mode="sampled": children drawn without replacement from the drafter's q (Gumbel-top-k),
# verified with q; tree slots allocated before drawing. Every case is one batch of N_SAMPLES rows
# (each row its own tree and depth / width), so batching is covered too.
SAMPLED_CASES = [
    ("v3-2x2", "plain", dict(node_budget=8, children=2)),
    ("v3-2x2", "cfg", dict(node_budget=6, children=3, width=3, depth=2)),
    ("v3-2x3-rowend", "cfg", dict(tree_init="above", node_budget=8, children=2)),
    ("v4-2x2", "t07-topk", dict(node_budget=7, children=3, tree_init="random")),
    ("v3-2x3-rowend", "mixed", dict(adaptive=False, depth=4, width=4, node_budget=9, children=2)),
    ("v4-2x2", "plain", dict(adaptive=False, depth=3, width=2, children=1, node_budget=4)),
    # three chains under the root's three draws (root_children)
    ("v4-2x2", "cfg", dict(adaptive=False, depth=3, width=3, children=1, root_children=3, node_budget=10)),
    # static best-first trees (static_tree.py): the default guesses (chain-like, a root sibling) over
    # row ends, and a bushy one (low first-draw guesses, high sibling guess)
    ("v3-2x3-rowend", "cfg", dict(adaptive=False, tree_shape="best_first", node_budget=8)),
    ("v4-2x2", "t07-topk", dict(adaptive=False, tree_shape="best_first", node_budget=9, accept_guess=0.5,
                                root_accept_guess=0.3, sibling_accept_guess=0.9)),
    # adaptive best-first: each step's shape chosen from the family by the neighbour's acceptance
    # (rows of the batch ask for different shapes; a step drafts the deepest asked for). At these
    # budgets the family has two shapes, a bushy one (guess 0.6: the first step) and chains
    ("v3-2x3-rowend", "cfg", dict(tree_shape="best_first", node_budget=8, accept_guess=0.6)),
    ("v4-2x2", "t07-topk", dict(tree_shape="best_first", node_budget=9, accept_guess=0.6, tree_init="above",
                                beta=0.5)),
]


QUICK_SAMPLED_CASES = (3, 4, 5, 6, 7, 8)


@pytest.mark.parametrize("case", mark_long(SAMPLED_CASES, QUICK_SAMPLED_CASES),
                         ids=lambda c: "-".join([c[0], c[1]] + [f"{k}={v}" for k, v in c[2].items()]))
def test_sampled_candidates_are_exact(case):
    m, s, params = case
    (p_value, stat, dof, tv), res = check_exact(m, s, candidate_mode="sampled", **params)
    print(f"\nsampled {m} {s} {params}: p={p_value:.3g} chi2={stat:.1f} dof={dof} TV={tv:.4f} "
          f"compression={res.stats.step_compression:.3f}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert not res.stats.lossy
    assert res.stats.step_compression > 1.0


# the default setting (an adaptive chain of sampled drafts, children=1, N=8) as shipped
DEFAULT_CASES = [("v3-2x2", "plain"), ("v3-2x3-rowend", "cfg"), ("v4-2x2", "t07-topk"), ("v3-2x3-rowend", "mixed")]


QUICK_DEFAULT_CASES = (1, 2)


@pytest.mark.parametrize("case", mark_long(DEFAULT_CASES, QUICK_DEFAULT_CASES), ids=lambda c: "-".join(c))
def test_default_setting_is_exact(case):
    m, s = case
    (p_value, stat, dof, tv), res = check_exact(m, s)
    print(f"\ndefault {m} {s}: p={p_value:.3g} chi2={stat:.1f} dof={dof} TV={tv:.4f} "
          f"compression={res.stats.step_compression:.3f}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert not res.stats.lossy
    assert res.stats.step_compression > 1.0


class NextLayersQ(ADTTreeDrafter):
    """Planted bug: each sampled draft verified with the q of the next expanded node (in the default
    chain: its child's q, computed from the draft itself) instead of the q it was drawn from."""

    def _assemble(self, *args, q_nodes=None, q_index=None, **kw):
        if q_index is not None:
            q_index = (q_index + 1).clamp(max=q_nodes.shape[1] - 1)
        return super()._assemble(*args, q_nodes=q_nodes, q_index=q_index, **kw)


def test_planted_wrong_q_on_the_default_is_caught(monkeypatch):
    use_drafter(monkeypatch, "adt_tree", NextLayersQ)
    # the default chain at its widest budget (the tuned one may be 2 on a busy machine: one layer, no next q)
    (p_value, stat, dof, tv), _ = check_exact("v3-2x2", "plain", node_budget=8)
    print(f"\nplanted wrong q on the default chain: p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"planted wrong q went unnoticed: p={p_value:.2e} TV={tv:.4f}"


class IndependentSiblings(ADTTreeDrafter):
    """Planted bug: sampled siblings (drawn WITHOUT replacement) verified as independent draws from q."""
    sampled_siblings = SIBLINGS_INDEPENDENT


class PruneByOwnScore(ADTTreeDrafter):
    """Planted bug: EAGLE-2's final rerank on sampled candidates -- twice the slots drawn, the best
    node_budget - 1 kept by cumulative score (a node's existence depends on its own value)."""

    def _slot_budget(self) -> int:
        return 2 * (self.node_budget - 1)

    def _kept_slots(self, score, allocated, index, keep: int):
        return torch.sort(score, dim=1, descending=True, stable=True).indices[:, :keep]


def test_planted_sampled_siblings_as_independent_draws_is_caught(monkeypatch):
    # planted bug: sampled siblings (drawn WITHOUT replacement) verified as independent draws from q
    # (qs rule: the rejected siblings are not removed from q)
    use_drafter(monkeypatch, "adt_tree", IndependentSiblings)
    (p_value, stat, dof, tv), _ = check_exact("v3-2x2", "plain", candidate_mode="sampled", node_budget=8, children=3,
                                              width=3)
    print(f"\nplanted independent-siblings bug: p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"planted independent-siblings bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_planted_independent_siblings_in_a_best_first_tree_is_caught(monkeypatch):
    params = dict(candidate_mode="sampled", adaptive=False, tree_shape="best_first", node_budget=9, accept_guess=0.5,
                  root_accept_guess=0.3, sibling_accept_guess=0.9)
    use_drafter(monkeypatch, "adt_tree", IndependentSiblings)
    (p_value, stat, dof, tv), _ = check_exact("v4-2x2", "t07-topk", **params)
    print(f"\nplanted independent-siblings bug (best_first): p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"planted bug went unnoticed in a best_first tree: p={p_value:.2e} TV={tv:.4f}"


def test_best_first_needs_sampled_candidates():
    for bad in (dict(candidate_mode="topk", adaptive=False), dict(candidate_mode="topk", adaptive=True)):
        with pytest.raises(ValueError, match="tree_shape=best_first is a static tree of sampled candidates.*'topk'"):
            specar.generate(model("v3-2x2"), "hi",
                            **generate_kwargs(backend="adt_tree", tree_shape="best_first", **bad))
    with pytest.raises(ValueError, match=r"tree_shape must be one of layers, best_first; got 'bushy'"):
        specar.generate(model("v3-2x2"), "hi", backend=specar.make_backend("adt_tree", tree_shape="bushy"))


def test_planted_prune_by_own_score_is_caught(monkeypatch):
    # planted bug: EAGLE-2's final rerank on sampled candidates -- twice the slots are drawn and the
    # best node_budget - 1 by cumulative score kept, so a node's existence depends on its own value.
    # Here: the root draws 2 children without replacement and the one with the larger q is kept
    # (the honest tree keeps the first draw, whatever its value).
    params = dict(candidate_mode="sampled", node_budget=2, children=2, width=2, depth=1, adaptive=False)
    honest = check_exact("v4-2x2", "plain", **params)[0]
    use_drafter(monkeypatch, "adt_tree", PruneByOwnScore)
    (p_value, stat, dof, tv), _ = check_exact("v4-2x2", "plain", **params)
    print(f"\nplanted prune-by-own-score bug: p={p_value:.3g} TV={tv:.4f} (honest: p={honest[0]:.3g} TV={honest[3]:.4f})")
    assert honest[0] > P_FAIL
    assert p_value < P_FAIL, f"planted prune-by-own-score bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_candidate_mode_is_validated():
    from specar.samplers.backends import make_backend
    with pytest.raises(ValueError, match=r"candidate_mode must be one of topk, sampled; got 'beam'"):
        make_backend("adt_tree", candidate_mode="beam")
    with pytest.raises(ValueError, match=r"candidate_mode must be one of topk, sampled; got 'beam'"):
        specar.generate(model("v3-2x2"), "hi", backend=specar.make_backend("adt_tree", candidate_mode="beam"))
    assert make_backend("adt_tree").params()["candidate_mode"] == "sampled"
    assert make_backend("adt_tree", preset="paper").params()["candidate_mode"] == "topk"


def test_planted_sibling_bug_is_caught(monkeypatch):
    # planted bug: a rejected sibling does not update the target (p instead of the residual), so
    # the next sibling is verified against the un-updated p
    monkeypatch.setattr(rejection_mod, "residual", lambda p, q: p)
    (p_value, stat, dof, tv), _ = check_exact("v3-2x2", "plain", node_budget=6, candidate_mode="topk")
    print(f"\nplanted sibling bug: p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"planted sibling bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


@pytest.mark.parametrize("model_name", mark_long(list(MODELS), (0, 1)))
@pytest.mark.parametrize("params", [dict(), dict(candidate_mode="topk"), dict(candidate_mode="topk", adaptive=False),
                                    dict(candidate_mode="topk", tree_init="above"),
                                    dict(candidate_mode="sampled", children=2),
                                    dict(candidate_mode="sampled", adaptive=False, children=2),
                                    dict(candidate_mode="sampled", adaptive=False, tree_shape="best_first"),
                                    dict(candidate_mode="sampled", tree_shape="best_first")])
def test_greedy_gives_the_argmax_sequence(model_name, params):
    mdl = model(model_name)
    tokens, argmax_image, _ = greedy_and_argmax(mdl, "adt_tree", 32, **params)
    assert (tokens == argmax_image).all()


def _tv(res, exact):
    return chi_square_test(res.tokens, exact)[3]


@pytest.mark.long
def test_relaxed_is_lossy_and_within_its_bound():
    """LANTERN: every sampled position is within delta of its exact target in TV, so an image of
    n positions is within 1 - (1 - delta)^n of exact AR. Sampling noise of the empirical TV over
    the 3^4 = 81 images at 16000 samples is below 0.5 * sqrt(81 / 16000) = 0.036 in expectation;
    we allow 0.05."""
    mdl = model("v3-2x2")
    exact = exact_distribution(mdl, "hi")
    n = mdl.geometry.num_image_tokens
    delta = 0.05
    res = specar.generate(mdl, "hi",
                          backend=specar.make_backend("adt_tree", relaxed=True, relaxed_delta=delta, relaxed_k=2,
                                                      node_budget=6, candidate_mode="topk"),
                          seed=5, batch_size=N_SAMPLES)
    assert res.stats.lossy
    bound = 1 - (1 - delta) ** n
    tv = _tv(res, exact)
    print(f"\nrelaxed delta={delta}: TV={tv:.4f}, bound {bound:.4f} (+0.05 noise)")
    assert tv <= bound + 0.05, f"TV {tv:.4f} > bound {bound:.4f} + noise"
    # a big delta really does change the distribution (the relaxation is active), delta = 0 is exact
    big = specar.generate(mdl, "hi",
                          backend=specar.make_backend("adt_tree", relaxed=True, relaxed_delta=0.5, relaxed_k=2,
                                                      node_budget=6, candidate_mode="topk"),
                          seed=5, batch_size=N_SAMPLES)
    tv_big = _tv(big, exact)
    print(f"relaxed delta=0.5: TV={tv_big:.4f}")
    assert tv_big > 0.06
    zero = specar.generate(mdl, "hi",
                           backend=specar.make_backend("adt_tree", relaxed=True, relaxed_delta=0.0, node_budget=6,
                                                       candidate_mode="topk"),
                           seed=5, batch_size=N_SAMPLES)
    assert chi_square_test(zero.tokens, exact)[0] > P_FAIL


def test_relaxed_needs_topk_candidates():
    with pytest.raises(ValueError, match=r"relaxed=True \(LANTERN\) .* needs candidate_mode=topk \(got "
                                         r"candidate_mode='sampled'\)"):
        specar.generate(model("v3-2x2"), "hi", backend=specar.make_backend("adt_tree", relaxed=True))


def test_runs_with_no_files_on_tiny_models_and_is_deterministic():
    mdl = tiny_model(16, (4, 4), seed=3, row_end=True)
    a = specar.generate(mdl, "a cat", backend="adt_tree", seed=11).tokens
    b = specar.generate(mdl, "a cat", backend="adt_tree", seed=11).tokens
    assert torch.equal(a, b)


def test_missing_drafter_names_the_training_command(tmp_path):
    mdl = tiny_model(4, (2, 2), seed=0)
    mdl.random_drafter_seed = None
    mdl.folder = str(tmp_path)
    with pytest.raises(ValueError, match="train-drafter --kind eagle"):
        specar.generate(mdl, "hi", backend="adt_tree")


def test_saved_drafter_loads_and_mismatched_target_is_refused(tmp_path):
    mdl = tiny_model(4, (2, 2), seed=0)
    net = EagleNet(EagleConfig.for_model(mdl))
    out = str(tmp_path / "eagle_drafter")
    save_drafter(out, "eagle", mdl, net.state_dict(), net.cfg.to_dict(), training={"steps": 0})
    loaded = load_eagle(mdl, out)
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    res = specar.generate(mdl, "hi", backend=specar.make_backend("adt_tree", drafter=out), seed=1, batch_size=4)
    assert res.tokens.shape == (4, 2, 2)
    other = tiny_model(4, (2, 2), seed=9)
    with pytest.raises(ValueError, match="trained for model"):
        load_eagle(other, out)
    # shapes are checked against drafter.json
    meta = json.load(open(os.path.join(out, "drafter.json")))
    meta["config"]["num_heads"] = 1
    meta["config"]["intermediate_size"] = 8
    json.dump(meta, open(os.path.join(out, "drafter.json"), "w"))
    with pytest.raises(ValueError, match="does not match"):
        load_eagle(mdl, out)


def test_shipped_demo_drafter_loads_and_runs():
    from specar.model_loaders.registry import load_model
    mdl = load_model("demo")
    net = load_eagle(mdl)  # fingerprint and shapes checked
    assert net.cfg.hidden_size == mdl.hidden_size
    # the setting README recommends for the demo model: adaptive best-first shapes of sampled drafts
    res = specar.generate(mdl, "a red circle",
                          backend=specar.make_backend("adt_tree", candidate_mode="sampled", tree_shape="best_first",
                                                      node_budget=128, beta=0.25),
                          seed=0)
    assert res.stats.step_compression > 3.0, res.stats.step_compression


@pytest.mark.parametrize("params", [dict(), dict(children=2, width=4), dict(tree_shape="best_first"),
                                    dict(candidate_mode="topk", node_budget=8)],
                         ids=["sampled-chain", "sampled-tree", "best_first", "topk"])
def test_plan_names_only_what_changes_the_step(monkeypatch, params):
    """`plan` lowers kmax to the smallest value with the same shapes and draws (one compiled graph per plan): the
    tokens and forwards of every step are those of the raw (dmax, kmax) hint, and a sampled chain's plans are its
    depths alone."""
    mdl = tiny_model(64, (4, 6), seed=3, row_end=True)
    kw = dict(backend="adt_tree", seed=5, batch_size=3, cfg_scale=2.0, reproducible=False,
              **{"node_budget": 8, **params})  # the widest budget: the raw hint's depth fits it
    seen = []
    canonical = ADTTreeDrafter.plan

    def recording(self, state, hint):
        plan = canonical(self, state, hint)
        seen.append((tuple(hint[:2]), plan))  # [dmax, kmax] (then what the budget chooser reads)
        return plan
    monkeypatch.setattr(ADTTreeDrafter, "plan", recording)
    got = specar.generate(mdl, "a cat", **generate_kwargs(**kw))
    monkeypatch.setattr(ADTTreeDrafter, "plan", lambda self, state, hint: (max(hint[0], 1), max(hint[1], 1)))
    want = specar.generate(mdl, "a cat", **generate_kwargs(**kw))
    assert torch.equal(got.tokens, want.tokens) and got.stats.nfe == want.stats.nfe
    raw, plans = {h for h, _ in seen}, {p for _, p in seen}
    assert len(plans) <= len(raw)
    if not params:  # the default chain: kmax never matters
        assert len({p[1] for p in plans}) == 1 and len({k for _, k in raw}) > 1
