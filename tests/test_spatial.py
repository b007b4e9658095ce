"""The spatial backend (Jacobi window drafted by spatial heads): exactness, a planted bug, greedy,
support at 8192 / 16384 codes, fixed shapes, parameters, head files.

Exactness follows tests/test_exactness.py (cases from tests/support/exactness.py): 16000 images in one batched
generation on a tiny model (random-weight heads, no files; every row its own frontier and tree),
Pearson chi-square against the teacher-forced enumeration of every image; a case fails when
p < P_FAIL = 1e-6. Each case also checks that the heads drafted some positions, so the head path
is what is being tested.
"""
import importlib.util
import json
import os

import pytest
import torch

import specar
from specar.model_loaders.files.drafter_files import save_drafter
from specar.samplers.backends import make_backend
from specar.samplers.drafters.spatial import drafter as drafter_mod
from specar.samplers.drafters.spatial.drafter import SpatialDrafter
from specar.samplers.drafters.spatial.network import SpatialConfig, load_heads, random_heads
from support.exactness import (EXACTNESS_MODELS, EXACTNESS_SAMPLES, EXACTNESS_SETTINGS, chi_square_test,
                            exact_distribution, exactness_model, greedy_and_argmax, mark_long, tiny_model, use_drafter)
from support.calls import generate_kwargs

P_FAIL = 1e-6
model = exactness_model


@pytest.fixture
def head_counts(monkeypatch):
    """Counts of entering positions drafted by a head / by `init`, summed over the generations run."""
    counts = torch.zeros(2, dtype=torch.long)  # [by a head, by init]

    class Counting(SpatialDrafter):
        def _head_drafts(self, state, pos, need):
            drafted = super()._head_drafts(state, pos, need)
            counts.add_(torch.stack([drafted.sum(), (need & ~drafted).sum()]).cpu())
            return drafted

    use_drafter(monkeypatch, "spatial", Counting)
    return lambda: counts.tolist()


# Models with more rows than the shared exactness models, so that positions enter the window after
# forwards have computed the rows above them (the heads' sources): 3^8 and 2^12 images to enumerate.
SPATIAL_MODELS = {
    "v3-2x4": dict(vocab_size=3, grid=(2, 4), seed=4),
    "v2-4x3-rowend": dict(vocab_size=2, grid=(4, 3), seed=5, row_end=True),
}
SETTINGS = {**EXACTNESS_SETTINGS, "t07-topp": dict(temperature=0.7, top_p=0.8),
            "cfg-t07": dict(cfg_scale=2.0, negative_prompt="no", temperature=0.7)}
_models = {}


def spatial_model(name):
    if name not in _models:
        _models[name] = tiny_model(**SPATIAL_MODELS[name])
    return _models[name]


def check_exact(model_name, setting, **params):
    mdl = spatial_model(model_name)
    kw = SETTINGS[setting]
    # reproducible=False: rejection sampling, where a wrong q shows (the reproducible mode: test_reproducible.py)
    res = specar.generate(mdl, "hi", **generate_kwargs(backend="spatial", reproducible=False, **kw, **params),
                          seed=1234, batch_size=EXACTNESS_SAMPLES)
    return chi_square_test(res.tokens, exact_distribution(mdl, "hi", **kw)), res


# (model, sampling setting, params): windows 1-6, head depths 1-2, the confidence gate head_below
# (0.8, 0.9; 1.0 = off: the default 0.2 is below 1 / V on these 2-3-code models, so it would gate every
# head draft), proactive trees as wide as the vocabulary, continuation off, gumbel
# re-drafts, fallback inits, row ends, CFG, T + top-k / top-p
CASES = [
    ("v3-2x4", "plain", dict(window=1, tree_depth=1, tree_width=1, head_below=1.0)),
    ("v3-2x4", "cfg", dict(window=3, tree_depth=2, tree_width=3, head_below=1.0)),
    ("v3-2x4", "t07-topk", dict(window=2, tree_depth=2, tree_width=2, init="random", head_depths=1, head_below=1.0)),
    ("v3-2x4", "mixed", dict(window=4, tree_depth=2, tree_width=2, continuation=False, head_below=1.0)),
    ("v2-4x3-rowend", "plain", dict(window=2, tree_depth=1, tree_width=1, head_below=0.9)),
    ("v2-4x3-rowend", "cfg", dict(window=4, tree_depth=2, tree_width=2, coupling="gumbel", init="sample_left",
                                        head_below=1.0)),
    ("v2-4x3-rowend", "t07-topp", dict(window=6, tree_depth=3, tree_width=2, init="repeat_left", head_below=1.0)),
    ("v2-4x3-rowend", "cfg-t07", dict(window=3, tree_depth=1, tree_width=2, head_depths=2, head_below=0.8)),
]


# `make test` runs the planted bug's correct twin (the first) and a row-end case with the confidence gate,
# `make test-long` the others (pytest.mark.long)
QUICK_CASES = (0, 4)


@pytest.mark.parametrize("case", mark_long(CASES, QUICK_CASES), ids=lambda c: "-".join([c[0], c[1]] + [f"{k}={v}" for k, v in c[2].items()]))
def test_spatial_is_exact(case, head_counts):
    m, s, params = case
    (p_value, stat, dof, tv), res = check_exact(m, s, **params)
    by_head, by_init = head_counts()
    print(f"\n{m} {s} {params}: p={p_value:.3g} chi2={stat:.1f} dof={dof} TV={tv:.4f} "
          f"compression={res.stats.step_compression:.3f} drafted by heads {by_head}, by init {by_init}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert not res.stats.lossy
    assert by_head > 1000, f"the heads drafted only {by_head} positions: the case does not test them"


def test_planted_head_q_bug_is_caught(monkeypatch, head_counts):
    # planted bug: head drafts are drawn from a flattened q (q^0.2, renormalised) while q is recorded
    real = drafter_mod.sample_by_race

    def flattened(q, noise):
        s = q ** 0.2
        return real(s / s.sum(-1, keepdim=True), noise)

    monkeypatch.setattr(drafter_mod, "sample_by_race", flattened)
    (p_value, stat, dof, tv), _ = check_exact("v3-2x4", "plain", window=1, tree_depth=1, tree_width=1, head_below=1.0)
    print(f"\nplanted head-q bug: p={p_value:.3g} TV={tv:.4f} heads drafted {head_counts()[0]}")
    assert p_value < P_FAIL, f"planted bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


@pytest.mark.parametrize("model_name", list(EXACTNESS_MODELS))
def test_greedy_gives_the_argmax_sequence(model_name):
    mdl = model(model_name)
    tokens, argmax_image, _ = greedy_and_argmax(mdl, "spatial", 64, window=3, tree_depth=2, tree_width=2)
    assert (tokens == argmax_image).all()


# -- support and greedy at real vocabulary sizes (the checks of tests/test_support.py) -------------
def _support_module():
    spec = importlib.util.spec_from_file_location("spatial_support_checks",
                                                  os.path.join(os.path.dirname(__file__), "test_support.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.BACKENDS["spatial"] = dict(window=2, tree_depth=1, tree_width=2, head_depths=2)
    return mod


# both `make test-long` (pytest.mark.long; 8192 codes took 78.9 s of a loaded 954 s make test run, 2026-11-26: moved
# to keep make test under 10 minutes): make test keeps tests/test_support.py's support cases (AR, sjd) and the greedy case below
@pytest.mark.parametrize("vocab,filt,batch", [pytest.param(8192, "topk", 420, marks=pytest.mark.long),
                                              pytest.param(16384, "topk", 210, marks=pytest.mark.long)])
def test_tokens_stay_in_the_support(vocab, filt, batch, head_counts):
    sup = _support_module()
    outside, outside_strict, expected_hits, races = sup.check_support("spatial", vocab, filt, batch)
    print(f"spatial V={vocab} {filt} B={batch}: races={races} expected E=0 hits={expected_hits:.1f} "
          f"outside={outside} (strict {outside_strict}); drafted by heads / init {head_counts()}")
    assert expected_hits >= sup.MIN_EXPECTED_HITS, f"too little power: {expected_hits:.1f}"
    assert outside == 0, f"{outside} tokens outside the target's support ({outside_strict} strict)"
    assert head_counts()[0] > 0


def test_greedy_is_argmax_at_16384_codes():
    sup = _support_module()
    mdl = sup.big_model(16384)
    res = specar.generate(mdl, "hi", backend=specar.make_backend("spatial", window=8, tree_depth=2, tree_width=2),
                          seed=1, batch_size=16, sampling=dict(temperature=0.0))
    assert not torch.isnan(res.sequence.float()).any()
    for seq, logits in sup.teacher_forced_logits(mdl, res.sequence):
        chosen = logits.gather(-1, seq.unsqueeze(-1)).squeeze(-1)
        assert (chosen >= logits.max(-1).values - 1e-3).all()


# -- shapes, parameters, determinism -------------------------------------------------------------
def test_two_fixed_forward_shapes(head_counts):
    mdl = tiny_model(16, (4, 4), seed=3, row_end=True)
    shapes = set()
    real = mdl.forward

    def spy(session, tokens, parents):
        shapes.add((tuple(tokens.shape), len(parents)))
        return real(session, tokens, parents)

    mdl.forward = spy
    specar.generate(mdl, "a cat",
                    backend=specar.make_backend("spatial", window=6, tree_depth=2, tree_width=3, head_below=1.0),
                    seed=1, batch_size=3, sampling=dict(cfg_scale=2.0))
    # the chain (pending + 6 drafts + the row ends among them) and the chain + 2 branches of depth 2
    T = 1 + 6 + 2
    assert shapes <= {((3, T), T), ((3, T + 4), T + 4)} and ((3, T), T) in shapes, shapes
    assert head_counts()[0] > 0


def test_confidence_gate_leaves_confident_positions_to_init(head_counts):
    """head_below: a head drafts only where the q recorded one row above has max < head_below."""
    mdl = spatial_model("v3-2x4")
    specar.generate(mdl, "hi",
                    backend=specar.make_backend("spatial", window=2, tree_depth=1, tree_width=2, head_below=1.0),
                    seed=3, batch_size=500)
    open_heads, _ = head_counts()
    specar.generate(mdl, "hi",
                    backend=specar.make_backend("spatial", window=2, tree_depth=1, tree_width=2, head_below=0.7),
                    seed=3, batch_size=500)
    gated_heads = head_counts()[0] - open_heads
    specar.generate(mdl, "hi",
                    backend=specar.make_backend("spatial", window=2, tree_depth=1, tree_width=2, head_below=0.0),
                    seed=3, batch_size=500)
    assert head_counts()[0] - open_heads - gated_heads == 0
    assert 0 < gated_heads < open_heads, (gated_heads, open_heads)


def test_same_seed_same_tokens():
    mdl = tiny_model(16, (4, 4), seed=3, row_end=True)
    a = specar.generate(mdl, "a cat", backend="spatial", seed=11).tokens
    b = specar.generate(mdl, "a cat", backend="spatial", seed=11).tokens
    assert torch.equal(a, b)


def test_without_heads_it_is_the_jacobi_window_with_its_init():
    """head_depths=0 drafts every position with `init`: the same tokens as sjd_pac with that init (both
    default to sample_above), the same stall restart (named: spatial's default 5, sjd_pac's 0) and the same tree
    (spatial's depth 3)."""
    mdl = tiny_model(16, (4, 4), seed=3)
    kw = dict(seed=5, batch_size=4, window=8, reproducible=False, restart_after=5)  # each backend's own draws
    a = specar.generate(mdl, "a cat", **generate_kwargs(backend="spatial", head_depths=0, **kw)).tokens
    b = specar.generate(mdl, "a cat", **generate_kwargs(backend="sjd_pac", tree_depth=3, **kw)).tokens
    assert torch.equal(a, b)


@pytest.mark.parametrize("params,message", [
    (dict(head_depths=5), "head_depths must be an int in \\[0, 4\\], got 5"),
    (dict(head_below=1.5), "head_below must be a number in \\[0, 1\\], got 1.5"),
    (dict(window=0), "window must be an int in \\[1, 128\\], got 0"),
    (dict(window=2, tree_depth=3), "tree_depth must be an int in \\[1, 2\\], got 3"),
    (dict(init="below"), "init must be one of random, .*; got 'below'"),
    (dict(coupling="none"), "coupling must be one of maximal, gumbel; got 'none'"),
])
def test_bad_parameters_name_the_value_and_what_is_allowed(params, message):
    with pytest.raises(ValueError, match=message):
        make_backend("spatial", **params)


def test_tree_wider_than_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="tree_width must be in \\[1, 3\\]"):
        specar.generate(model("v3-2x2"), "hi",
                        backend=specar.make_backend("spatial", tree_width=4, tree_depth=1, window=2))


# -- head files ----------------------------------------------------------------------------------
def _with_folder(tmp_path, **kw):
    mdl = tiny_model(4, (3, 3), **kw)
    mdl.folder = str(tmp_path)
    mdl.random_drafter_seed = None
    return mdl


def test_missing_heads_names_the_training_command(tmp_path):
    with pytest.raises(ValueError, match="train-drafter --kind spatial"):
        specar.generate(_with_folder(tmp_path), "hi", backend="spatial")


def test_heads_from_a_file_and_mismatches(tmp_path):
    mdl = _with_folder(tmp_path)
    folder = os.path.join(str(tmp_path), "spatial_heads")
    cfg = SpatialConfig(mdl.hidden_size, 2)
    heads = random_heads(cfg, 5)
    save_drafter(folder, "spatial", mdl, heads.state_dict(), cfg.to_dict(), training={"steps": 0})
    loaded = load_heads(mdl, 1)
    assert torch.equal(loaded.weight, heads.weight[:1])
    res = specar.generate(mdl, "hi", backend=specar.make_backend("spatial", window=4), seed=2, batch_size=4)
    assert res.tokens.shape == (4, 3, 3)
    with pytest.raises(ValueError, match="head_depths=3"):
        specar.generate(mdl, "hi", backend=specar.make_backend("spatial", head_depths=3))
    other = _with_folder(tmp_path, seed=9)  # another target: refused by its fingerprint
    with pytest.raises(ValueError, match="not for the loaded model"):
        load_heads(other, 2)
    with pytest.raises(ValueError, match="not a 'spatial' one"):  # a Hawk folder is not spatial heads
        meta = json.load(open(os.path.join(folder, "drafter.json")))
        json.dump({**meta, "kind": "hawk"}, open(os.path.join(folder, "drafter.json"), "w"))
        load_heads(mdl, 2)
    json.dump({**meta, "config": {**meta["config"], "depths": 3}}, open(os.path.join(folder, "drafter.json"), "w"))
    with pytest.raises(ValueError, match="does not match"):  # shapes that disagree with drafter.json
        load_heads(mdl, 2)


def test_shipped_demo_heads_load_and_draft(head_counts):
    from specar.model_loaders.registry import load_model
    mdl = load_model("demo")
    heads = load_heads(mdl, 2)  # fingerprint and shapes checked
    assert heads.weight.shape == (2, mdl.hidden_size, 3 * mdl.hidden_size)
    res = specar.generate(mdl, "a red circle", backend="spatial", seed=0)
    by_head, by_init = head_counts()
    print(f"demo spatial seed 0: compression {res.stats.step_compression:.2f}, drafted by heads {by_head}, "
          f"by init {by_init}")
    assert by_head > 10  # the confidence gate leaves flat regions to `init`; the heads draft the rest
    assert res.stats.step_compression > 4.0, res.stats.step_compression
