"""auto with SJD-PAC's proactive branches: after a rejection a step may carry K-1 branches of depth D
under the pending token; auto carries them when their measured gain beats their cost (always with the forwards
cost model). Chi-square exactness with the branches carried (a planted uncapped branch acceptance is caught), the
carry decision from costs and the measured gain, and the compiled step's plans (one graph per window and
branches-or-not: every drafting step grows).
"""
import pytest
import torch

import specar
from specar.samplers.backends import make_backend
from specar.samplers.drafters import auto as auto_mod
from specar.samplers.drafters.auto.drafter import AutoDrafter
from specar.samplers.verification import branches as branches_mod
from specar.samplers.drafters.jacobi.drafter import JacobiDrafter
from specar.samplers.target import SamplingParams
from support.exactness import check_exact, exactness_model, tiny_model
from support.calls import generate_kwargs

P_FAIL = 1e-6
# the planted sibling bug's setting of tests/test_exactness.py (sjd_pac there), with auto choosing the steps
BRANCHES = dict(max_window=3, cost_model="forwards", tree_width=3, tree_depth=2, init="random")
CASES = [("v3-2x2", "plain"), ("v4-2x2", "cfg")]


@pytest.mark.parametrize("model_name,setting", CASES)
def test_auto_with_the_branches_is_exact(model_name, setting):
    (p_value, stat, dof, tv), res = check_exact("auto", model_name, setting, **BRANCHES)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    report = res.stats.backend_report
    assert report["tree_steps"] > 0 and report["tree_gain"] > 0, report


def test_planted_sibling_bug_is_caught_in_auto(monkeypatch):
    """Planted bug: the branches' first tokens (drawn without replacement) verified as if each came from the
    unchanged q (the rejected siblings not removed from it)."""
    real = branches_mod.verify_candidates

    def no_q_update(p, cands, u, noise, q=None, qs=None, valid=None):
        return real(p, cands, u, noise, qs=q[..., None, :].expand(*cands.shape, q.shape[-1]), valid=valid)

    monkeypatch.setattr(branches_mod, "verify_candidates", no_q_update)
    (p_value, stat, dof, tv), res = check_exact("auto", "v3-2x2", "plain", **BRANCHES)
    print(f"\nplanted sibling bug in auto: p={p_value:.3g} TV={tv:.4f}")
    assert res.stats.backend_report["tree_steps"] > 0
    assert p_value < P_FAIL, f"the planted sibling bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def _policy(**params):
    drafter = make_backend("auto", max_window=8, **params).make_drafter(exactness_model("v4-2x2"), SamplingParams())
    drafter.reset_policy()
    return drafter


def test_the_branches_ride_where_they_pay():
    # forwards: every window at least D deep carries them (a forward costs 1 with or without them)
    drafter = _policy(cost_model="forwards", tree_depth=4, tree_width=3)
    assert [w for w in sorted(drafter.shapes) if drafter.policy.tree_pays(w)] == [4, 8]
    # measured: a step with the branches at 3x the chain's cost does not pay for a quarter token ...
    drafter = _policy(tree_depth=2, tree_width=3)
    chain = {w: 0.010 + 0.001 * w for w in drafter.shapes}
    drafter.set_costs({**chain, **{("tree", w): 3 * chain[w] for w in drafter.policy.tree_windows}})
    assert not any(drafter.policy.tree_pays(w) for w in drafter.shapes)
    # ... at 1.05x the chain's cost the prior gain (a quarter token on ~3 tokens per step) pays; a measured gain
    # of nothing turns them off
    drafter.set_costs({**chain, **{("tree", w): 1.05 * chain[w] for w in drafter.policy.tree_windows}})
    assert all(drafter.policy.tree_pays(w) for w in drafter.policy.tree_windows)
    drafter.policy.tree_rows, drafter.policy.tree_added = 10_000, 0.0
    assert not any(drafter.policy.tree_pays(w) for w in drafter.shapes)
    # tree_width=1: none
    assert not _policy(cost_model="forwards", tree_width=1).policy.tree_windows


def test_the_engine_times_the_branches_shapes():
    drafter = _policy(tree_depth=2, tree_width=3)
    shapes = drafter.cost_shapes()
    assert {k for k in shapes if isinstance(k, tuple)} == {("tree", w) for w in (2, 4, 8)}
    assert all(len(shapes[("tree", w)]) == len(shapes[w]) + 2 * 2 for w in (2, 4, 8))


def test_a_branch_deeper_than_every_window_is_refused():
    with pytest.raises(ValueError, match="tree_depth must be an int in \\[1, 2\\], got 3"):
        make_backend("auto", max_window=2, tree_depth=3)
    make_backend("auto", max_window=2, tree_depth=3, tree_width=1)  # no branches: any depth


@pytest.mark.long  # compiles 4-6 graphs of the step (about 25 s)
def test_compiled_auto_grows_every_drafting_step_and_matches_eager():
    """Compiled, every drafting step plans grow (one graph per window and branches-or-not instead of two); the
    tokens are eager's (same image as AR: the grown positions' drafts are position noise, and a grow with nothing
    to draft writes nothing)."""
    kw = dict(vocab_size=16, grid=(4, 4), seed=5, row_end=True)
    eager, comp = tiny_model(**kw), tiny_model(**kw)
    plans = []
    real_plan = AutoDrafter.plan

    def recorded(self, state, hint):
        plan = real_plan(self, state, hint)
        plans.append((state.ctx.compiled, plan))
        return plan
    args = dict(backend="auto", seed=3, batch_size=2, cfg_scale=2.0, max_window=4, cost_model="forwards")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AutoDrafter, "plan", recorded)
        want = specar.generate(eager, "a cat", **generate_kwargs(**args))
        got = specar.generate(comp, "a cat", **generate_kwargs(compile=True, **args))
    assert torch.equal(got.tokens, want.tokens)
    compiled = [p for c, p in plans if c]
    assert compiled and all(p.grow for p in compiled if p.window) and not any(p.grow for p in compiled if not p.window)
    assert not all(p.grow for c, p in plans if not c and p.window)  # eager grows only when the window grew
    assert got.stats.compile["graph_breaks"] == 0 and got.stats.compile["recompiles"] == 0
