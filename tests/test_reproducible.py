"""reproducible=True ("same image as AR", docs/REPRODUCIBLE.md): every lossless backend gives plain
AR's tokens for a seed, whatever it drafts.

- AR with position-keyed noise (argmax(log p + G[row, position])) samples exactly p: chi-square
  against exact enumeration (16000 images, fail at p < 1e-6, as tests/test_exactness.py).
- every lossless backend (several parameter sets each) yields AR's sequence token for token, for
  every row of a batch (each row is its own seed: its noise is keyed by the row), with CFG, row
  ends, top-k, top-p and temperature, on models where rows draft trees of different shapes.
- a planted near-miss (a draft accepted when it is the target's second best under the noise) is
  caught by the same comparisons: tokens that are not AR's, and the chi-square.
- auto gives the same image under random step-cost noise (the engine's clock monkeypatched).
"""
import random
import time

import pytest
import torch

import specar
from specar.samplers.verification import agreement as agreement_mod
from specar.samplers.forward_costs import _FORWARD_COSTS
from specar.samplers.randomness import GUMBEL_TABLE_BYTES, PositionNoise, position_gumbel
from support.exactness import EXACTNESS_SETTINGS, check_exact, exactness_model, greedy_and_argmax, tiny_model
from support.calls import generate_kwargs

P_FAIL = 1e-6
BATCH = 24  # rows per generation: 24 independent seeds' worth of noise

_models = {}


def model(name):
    if name not in _models:
        _models[name] = tiny_model(16, (4, 5), seed=3, row_end=True) if name == "v16-4x5-rowend" \
            else exactness_model(name)
    return _models[name]


# (backend, parameters, model): every lossless backend, defaults and the variants that change how drafts are made
CASES = [
    ("sjd", dict(window=3, init="random"), "v3-2x3-rowend"),
    ("sjd", {}, "v16-4x5-rowend"),
    ("scd", dict(window=3, coupling="maximal", init="repeat_left"), "v4-2x2"),
    ("scd", dict(coupling="gumbel", coupling_strength=0.5), "v16-4x5-rowend"),
    ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3), "v3-2x3-rowend"),
    ("sjd_pac", {}, "v16-4x5-rowend"),
    ("sjd_pac", dict(window=8, tree_depth=3, tree_width=4, continuation=False, init="random"), "v16-4x5-rowend"),
    ("auto", dict(max_window=4), "v3-2x3-rowend"),
    ("auto", dict(cost_model="forwards"), "v16-4x5-rowend"),
    ("hawk", {}, "v16-4x5-rowend"),
    ("hawk", dict(vertical_depth=2, candidates=3, node_budget=16), "v16-4x5-rowend"),
    ("hawk", dict(horizontal_heads=2, candidates=2, node_budget=6), "v3-2x3-rowend"),
    ("adt_tree", {}, "v16-4x5-rowend"),
    ("adt_tree", dict(candidate_mode="topk"), "v16-4x5-rowend"),
    ("adt_tree", dict(candidate_mode="topk", node_budget=12, width=4), "v4-2x2"),
    ("adt_tree", dict(tree_shape="best_first", children=2), "v16-4x5-rowend"),
    ("spatial", {}, "v16-4x5-rowend"),
    ("spatial", dict(window=4, tree_depth=2, tree_width=3, head_below=1.0), "v3-2x3-rowend"),
]
SETTINGS = ["plain", "cfg", "topk", "topp", "mixed", "t07-topk"]


def _setting(i, name):
    kw = dict(EXACTNESS_SETTINGS[SETTINGS[i % len(SETTINGS)]])
    if "top_k" in kw:
        kw["top_k"] = min(kw["top_k"], model(name).geometry.vocab_size)
    return kw


def _ar(name, seed, batch, **kw):
    return specar.generate(model(name), "hi", **generate_kwargs(backend="ar", reproducible=True, **kw), seed=seed,
                           batch_size=batch)


@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: "-".join(
    [CASES[i][0]] + [f"{k}={v}" for k, v in CASES[i][1].items()] + [CASES[i][2]]))
def test_every_lossless_backend_gives_ars_tokens(i):
    backend, params, name = CASES[i]
    for j, seed in enumerate((1234 + i, 7)):
        kw = _setting(i + 2 * j, name)  # two settings per case, all six over the cases
        want = _ar(name, seed, BATCH, **kw)
        got = specar.generate(model(name), "hi", **generate_kwargs(backend=backend, reproducible=True, **kw, **params),
                              seed=seed, batch_size=BATCH)
        same = (got.sequence == want.sequence).all(1)
        assert same.all(), f"{backend} {params} {kw} seed {seed}: rows {(~same).nonzero().flatten().tolist()} " \
                           f"differ from AR's"
        if backend != "ar" and j == 0 and not kw:
            assert got.stats.nfe <= want.stats.nfe  # fewer or as many forwards, never more


def test_a_row_is_its_own_seed_whatever_the_batch():
    """Row b's noise is keyed by (seed, b, position): a batch of 1 is row 0 of any batch, whichever backend."""
    big = _ar("v16-4x5-rowend", 5, 6)
    for backend in ("ar", "sjd_pac", "hawk"):
        one = specar.generate(model("v16-4x5-rowend"), "hi", backend=backend, seed=5, options=dict(reproducible=True))
        assert torch.equal(one.sequence[0], big.sequence[0])
    assert not torch.equal(big.sequence[0], big.sequence[1])
    other = _ar("v16-4x5-rowend", 6, 6)
    assert not torch.equal(other.sequence, big.sequence)


def test_greedy_is_the_argmax_sequence():
    tokens, argmax_image, prob = greedy_and_argmax(model("v3-2x3-rowend"), "sjd_pac", 16, window=3, tree_depth=2,
                                                   tree_width=3, reproducible=True)
    assert prob == pytest.approx(1.0) and (tokens == argmax_image).all()


@pytest.mark.parametrize("backend,model_name,setting,params", [
    ("ar", "v3-2x3-rowend", "mixed", {}),
    ("ar", "v4-2x2", "cfg", {}),
    ("sjd", "v3-2x2", "plain", dict(window=3)),
])
def test_position_keyed_sampling_is_exact(backend, model_name, setting, params):
    (p_value, stat, dof, tv), res = check_exact(backend, model_name, setting, reproducible=True, **params)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"


def near_miss(tokens, keys):
    """Planted bug: a draft also agrees when it is the target's SECOND best under the noise."""
    top2 = keys.topk(2, dim=-1).indices
    return (tokens == top2[..., :1]) | (tokens == top2[..., 1:2])


@pytest.mark.parametrize("backend,params", [("sjd", dict(window=3)), ("hawk", dict(node_budget=6)),
                                            ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3))])
def test_planted_near_miss_gives_other_tokens(monkeypatch, backend, params):
    name = "v3-2x3-rowend"
    want = _ar(name, 3, 64)
    monkeypatch.setattr(agreement_mod, "agreeing", near_miss)
    got = specar.generate(model(name), "hi", **generate_kwargs(backend=backend, reproducible=True, **params), seed=3,
                          batch_size=64)
    assert not torch.equal(got.sequence, want.sequence), "a near-miss acceptance went unnoticed"


def test_planted_near_miss_fails_the_chi_square(monkeypatch):
    monkeypatch.setattr(agreement_mod, "agreeing", near_miss)
    (p_value, stat, dof, tv), _ = check_exact("sjd", "v3-2x2", "plain", reproducible=True, window=3)
    assert p_value < P_FAIL, f"planted near-miss went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_position_noise_table_equals_hashing():
    pos = torch.tensor([[0, 3, 5], [2, 2, 9]])
    table = PositionNoise(11, 2, 10, 7, "cpu")
    want = position_gumbel(table.key, torch.arange(2)[:, None], pos, 7)
    assert table.table is None and torch.equal(table(pos), want)  # built at the first call
    assert table.table is not None and table.table.numel() * 4 <= GUMBEL_TABLE_BYTES
    hashed = PositionNoise(11, 2, 10, 7, "cpu")
    hashed.tabled = False
    assert torch.equal(hashed(pos), want)
    assert not torch.equal(want[0, 1], want[1, 1])  # rows differ at the same position


def test_lossy_and_bad_values_are_refused():
    mdl = model("v16-4x5-rowend")
    with pytest.raises(ValueError, match="reproducible=True .* needs a lossless backend.*relaxed"):
        specar.generate(mdl, "hi", backend=specar.make_backend("adt_tree", candidate_mode="topk", relaxed=True),
                        options=dict(reproducible=True))
    with pytest.raises(ValueError, match="reproducible must be True, False or None .*got 'yes'"):
        specar.generate(mdl, "hi", backend="ar", options=dict(reproducible="yes"))


class NoisyClock:
    """time.perf_counter plus a random, growing offset: every timing it serves (the engine's calibration forwards,
    auto's step clock) gets random extra time, as on a loaded machine."""

    def __init__(self, seed):
        self.rng, self.offset, self.real = random.Random(seed), 0.0, time.perf_counter

    def __call__(self):
        self.offset += self.rng.expovariate(1 / 0.003)
        return self.real() + self.offset


class SteadyClock:
    """A clock that advances `tick` seconds per read: every step costs the same, on a machine `tick` times slower
    than a one-second one (the per-step timings scale every window's cost alike, nothing else)."""

    def __init__(self, tick):
        self.tick, self.now = tick, 0.0

    def __call__(self):
        self.now += self.tick
        return self.now


@pytest.mark.parametrize("reproducible,cost_model,recalibrate", [(True, "measured", True), (False, "forwards", True),
                                                                 (False, "measured", False)])
def test_auto_repeats_under_step_cost_noise(monkeypatch, reproducible, cost_model, recalibrate):
    """reproducible: auto's windows follow the noisy timings, its tokens do not (AR's); off: the
    forwards cost model ignores the clock, and the measured one repeats while the model keeps its
    calibration and the step timings scale alike (the seed tooltip's promise; with the step times themselves
    noisy the image follows them, as cost_model's help says, so auto's step clock is then a steady one at a
    different speed per run). recalibrate: each run times the forwards again (the model's cost cache cleared)."""
    from specar.samplers.drafters.auto.drafter import AutoDrafter
    mdl = model("v16-4x5-rowend")
    _FORWARD_COSTS.pop(mdl, None)
    runs = []
    for clock_seed in (1, 2, 3):
        monkeypatch.setattr(time, "perf_counter", NoisyClock(clock_seed))
        steps = NoisyClock(clock_seed + 10) if recalibrate else SteadyClock(1e-3 * clock_seed)
        monkeypatch.setattr(AutoDrafter, "clock", staticmethod(steps))
        if recalibrate:
            _FORWARD_COSTS.pop(mdl, None)
        res = specar.generate(mdl, "hi", backend=specar.make_backend("auto", cost_model=cost_model), seed=9,
                              batch_size=8, options=dict(reproducible=reproducible))
        runs.append(res)
    monkeypatch.undo()
    _FORWARD_COSTS.pop(mdl, None)
    assert all(torch.equal(r.sequence, runs[0].sequence) for r in runs)
    if reproducible:
        assert torch.equal(runs[0].sequence, _ar("v16-4x5-rowend", 9, 8).sequence)


def test_bench_runs_both_modes_and_counts_images_equal_to_ars():
    from specar.cli import benchmark
    mdl = model("v16-4x5-rowend")
    configs = benchmark.in_both_modes([benchmark.parse_config(c) for c in ("ar", "sjd_pac:window=4", "hawk")])
    configs.append(benchmark.parse_config("sjd:window=3,reproducible=true"))
    rows = benchmark.run(mdl, configs, ["x", "y"], [0, 1], warmup=False)
    assert [(r["backend"], r["reproducible"]) for r in rows] == [
        ("ar", False), ("ar", True), ("sjd_pac", False), ("sjd_pac", True), ("hawk", False), ("hawk", True),
        ("sjd", True)]
    for r in rows:
        assert r["same_tokens_as_ar"] == (r["samples"] if r["reproducible"] else None), r["label"]
        assert set(r["acceptance_by_depth"]) == {str(d) for d in range(1, 9)}
    assert "images token-identical to reproducible AR's" in benchmark.format_table(rows)
