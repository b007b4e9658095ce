"""sjd_pac is exact when a proactive branch wins the tree step.

When sibling k >= 1 wins depth 1, the branch holds only D nodes of its own; the chain's nodes
after them were computed in the CHAIN's context (its depth 1..D tokens), so their outputs (the p
of positions D+2, ...) and their KV are wrong for the branch. Acceptance must stop at depth D.
The bug needs a position D+2 after the pending token inside the window, so every case here runs
on a grid where that exists: 1x6 without row ends, and 2x3 with row ends (a forced row end right
after the branch also reaches past it, so even window 1 / depth 1 is affected there).

Each case draws N images in one batched generation and runs the Pearson chi-square of
`testing.chi_square_test` against the exact enumeration; a case fails at p < P_FAIL = 1e-6 as in
tests/test_exactness.py. Detection power (measured on the code before the fix, two sampling seeds
each, N = 20000): the effect depends strongly on the model, so the row-end cases use the tiny
model with seed 0, where every listed configuration is far from exact (chi2 - dof = 900-14000,
i.e. TV 0.06-0.26, p < 1e-160); the 1x6 cases (model seed 5) give chi2 - dof = 1200-1800
(p < 1e-200). With a non-centrality of ~900 at dof ~51-75 the statistic is ~20 standard
deviations above the P_FAIL threshold. The suite's own row-end model (seed 1, as in
test_exactness.py) shows a much smaller effect (chi2 - dof ~ 144 at N = 30000 for K2 D1 w1;
~40-85 at N = 100000 for the default window 64 / depth 3), so it is run at N = 60000 for the
window-1 case only (expected chi2 ~ 400 vs a threshold ~ 200).

The planted-bug test replaces the fix, `cap_branch_acceptance` of the chain step
(samplers/verification/branches.py), by the identity, i.e. restores the old behaviour, and shows the
same chi-square catches it.
"""
import pytest

import specar
from specar.samplers.verification import branches as branches_mod
from support.exactness import chi_square_test, exact_distribution, mark_long, tiny_model
from support.calls import generate_kwargs

P_FAIL = 1e-6

MODELS = {
    "v3-1x6": dict(vocab_size=3, grid=(1, 6), seed=5),
    "v3-2x3-rowend-s0": dict(vocab_size=3, grid=(2, 3), seed=0, row_end=True),
    "v3-2x3-rowend": dict(vocab_size=3, grid=(2, 3), seed=1, row_end=True),  # test_exactness.py's model
}
N = 20000
# (id, backend params, model, N, seed); K = tree_width, D = tree_depth, w = window
CASES = [
    ("K3-D1-w6", dict(window=6, tree_depth=1, tree_width=3), "v3-1x6", N, 101),
    ("K2-D1-w6-nocont", dict(window=6, tree_depth=1, tree_width=2, continuation=False), "v3-1x6", N, 102),
    ("K2-D1-w1-rowend", dict(window=1, tree_depth=1, tree_width=2), "v3-2x3-rowend-s0", N, 103),
    ("K3-D2-w6-gumbel-rowend", dict(window=6, tree_depth=2, tree_width=3, coupling="gumbel"), "v3-2x3-rowend-s0",
     N, 104),
    ("K3-default-w64-D3-rowend", dict(tree_width=3), "v3-2x3-rowend-s0", N, 105),
    ("K2-D1-w1-rowend-suite-model", dict(window=1, tree_depth=1, tree_width=2), "v3-2x3-rowend", 60000, 106),
]
_models, _exact = {}, {}


def model(name):
    if name not in _models:
        _models[name] = tiny_model(**MODELS[name])
    return _models[name]


def exact(name):
    if name not in _exact:
        _exact[name] = exact_distribution(model(name), "hi")
    return _exact[name]


def run_case(params, model_name, n, seed):
    # reproducible=False: the tree step's rejection sampling (the reproducible mode: tests/test_reproducible.py)
    res = specar.generate(model(model_name), "hi", **generate_kwargs(backend="sjd_pac", reproducible=False, **params),
                          seed=seed, batch_size=n)
    return chi_square_test(res.tokens, exact(model_name)), res


# `make test` runs the planted bug's correct twin, `make test-long` the others (pytest.mark.long)
QUICK_CASES = (3,)


@pytest.mark.parametrize("case", mark_long(CASES, QUICK_CASES), ids=[c[0] for c in CASES])
def test_sjd_pac_tree_is_exact(case):
    _, params, m, n, seed = case
    (p_value, stat, dof, tv), res = run_case(params, m, n, seed)
    print(f"{case[0]}: N={n} chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}")
    assert p_value > P_FAIL, f"N={n} chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"


# -- planted bug: the old behaviour (acceptance continues past the branch into the chain) ---------

def test_planted_uncapped_branch_acceptance_is_caught(monkeypatch):
    monkeypatch.setattr(branches_mod, "cap_branch_acceptance", lambda n_acc, k_star, depth: n_acc)
    params = dict(window=6, tree_depth=2, tree_width=3, coupling="gumbel")
    (p_value, stat, dof, tv), _ = run_case(params, "v3-2x3-rowend-s0", N, 104)
    print(f"planted: N={N} chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}")
    assert p_value < P_FAIL, f"planted uncapped-branch bug went unnoticed: chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
