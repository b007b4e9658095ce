"""The compiled decode step samples exactly plain AR's distribution too.

compile=True runs the whole step (propose, forward, target, verify, commit, observe) as one graph
per plan, with the random draws of each step made before its graph and replayed in it. The same
chi-square test as tests/test_exactness.py (16000 images in one batched generation against exact
enumeration, fail at p < 1e-6) for ar, scd, sjd_pac, auto, hawk and adt_tree compiled, in the
rejection-sampling mode (reproducible=False: each backend's own draws, which the replay serves);
and the test catches a planted verification bug inside the compiled graph. Every case compiles
(tens of seconds on a CPU), so all of them run in `make test-long`; `make test` keeps the token
comparisons of tests/test_compile.py.
"""
import pytest

from specar.samplers.verification import rejection as rejection_mod
from support.exactness import check_exact

P_FAIL = 1e-6
CASES = [
    ("ar", {}, "v3-2x3-rowend", "cfg"),
    ("scd", dict(window=3, init="random"), "v3-2x2", "plain"),
    ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3), "v3-2x2", "topk"),
    ("auto", dict(max_window=3, cost_model="forwards"), "v3-2x3-rowend", "mixed"),
    ("hawk", dict(node_budget=6), "v4-2x2", "cfg"),
    ("adt_tree", dict(node_budget=6, candidate_mode="sampled", children=1), "v3-2x2", "plain"),
    ("hawk", {}, "v3-2x2", "plain"),  # node_budget=0: chosen from the measured costs (forward_costs.BudgetFromCosts)
    ("adt_tree", {}, "v3-2x3-rowend", "cfg"),
]


@pytest.mark.long
@pytest.mark.parametrize("backend,params,model_name,setting", CASES, ids=[c[0] for c in CASES])
def test_compiled_backend_is_exact(backend, params, model_name, setting):
    if backend == "adt_tree":
        # its plan (the deepest and widest tree a row asks for) changes from step to step, and a plan's first
        # step runs eager: on images of a few tokens a generation meets most plans once. A first generation
        # (another seed) records them, so the tested one runs its steps in the compiled graphs
        check_exact(backend, model_name, setting, seed=99, compile=True, **params)
    (p_value, stat, dof, tv), res = check_exact(backend, model_name, setting, compile=True, **params)
    c = res.stats.compile
    assert c["eager_fallback"] == "" and c["graph_breaks"] == 0 and c["recompiles"] == 0
    assert c["graphs_used"] >= 1 and c["step_graph_s"] > 0  # the steps ran in the compiled graph
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"


@pytest.mark.long
def test_planted_wrong_residual_in_the_compiled_step_is_caught(monkeypatch):
    # planted bug: after a rejection resample from p instead of norm(max(0, p - q)), traced into the graph
    monkeypatch.setattr(rejection_mod, "residual", lambda p, q: p)
    (p_value, stat, dof, tv), res = check_exact("scd", "v3-2x2", "plain", compile=True, window=3,
                                                init="repeat_left")
    assert res.stats.compile["eager_fallback"] == "" and res.stats.compile["step_graph_s"] > 0
    assert p_value < P_FAIL, f"planted residual bug went unnoticed in the compiled step: p={p_value:.2e} TV={tv:.4f}"
