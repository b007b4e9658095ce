"""Stall restart (`restart_after`): re-drafting a stuck window by `init` stays lossless.

The restart decision reads only earlier steps (how many steps in a row committed one token), and
the fresh drafts record the q they were drawn from, so every MRS check stays exact. The cases run
with restart_after=1 (a restart after every rejected first draft: as often as it can happen) and
2, on the chi-square harness of test_exactness.py (16000 images, fail at p < 1e-6); a planted
restart that peeks at the draft it is about to replace is caught, and the restart is shown to
fire in the cases (a test that never restarts would prove nothing).
"""
import pytest
import torch

from specar.samplers.drafters.jacobi import drafter as jacobi_mod
from support.exactness import check_exact, mark_long

P_FAIL = 1e-6

CASES = [
    ("scd", dict(window=3, init="sample_above", restart_after=1), "v3-2x2", "plain"),
    ("scd", dict(window=16, init="sample_left", coupling="gumbel", restart_after=2), "v3-2x3-rowend", "cfg"),
    ("sjd", dict(window=2, init="repeat_left", restart_after=1), "v4-2x2", "topk"),
    ("sjd_pac", dict(window=3, tree_depth=2, tree_width=3, init="sample_above", restart_after=1), "v3-2x3-rowend",
     "mixed"),
    ("auto", dict(max_window=3, cost_model="forwards", restart_after=1), "v3-2x2", "cfg"),
]


@pytest.fixture
def restarts(monkeypatch):
    """Counts the rows restarted over a generation (the cases must exercise the restart)."""
    seen = []
    real = jacobi_mod.JacobiDrafter._stalled_rows

    def counting(self, state, n_accepted):
        restart = real(self, state, n_accepted)
        seen.append(int(restart.sum()))
        return restart

    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_stalled_rows", counting)
    return seen


# `make test` runs the planted peek's correct twin (the first) and sjd, `make test-long` the others (pytest.mark.long)
@pytest.mark.parametrize("backend,params,model_name,setting", mark_long(CASES, (0, 2), several_names=True),
                         ids=[f"{c[0]}-{c[1]['restart_after']}-{c[2]}-{c[3]}" for c in CASES])
def test_restart_is_exact(backend, params, model_name, setting, restarts):
    (p_value, stat, dof, tv), _ = check_exact(backend, model_name, setting, **params)
    assert sum(restarts) > 1000, f"the restart fired only {sum(restarts)} times: the case does not test it"
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"


def test_planted_peeking_restart_is_caught(monkeypatch):
    """Planted bug: restart exactly the rows whose current draft at the next position is token 0
    (`pytest -s tests/test_restart.py -k peeking` prints the p-value; drafts from `random` init, whose q
    is flat, hide this bias better, so the case uses sample_above).
    The surviving drafts are then conditioned on not being 0, no longer distributed as their q."""
    def peeking(self, state, n_accepted):
        # the draft at the first position after the new frontier, the window's first
        return (state.seq.gather(1, state.frontier[:, None] + 1).squeeze(1) == 0) & state.active

    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_stalled_rows", peeking)
    (p_value, stat, dof, tv), _ = check_exact("scd", "v3-2x2", "plain", window=3, init="sample_above", restart_after=1)
    print(f"planted peeking restart: chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}")
    assert p_value < P_FAIL, f"the planted peeking restart went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_restart_after_zero_never_restarts(monkeypatch):
    called = []
    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_stalled_rows", lambda *a: called.append(1))
    check_exact("scd", "v3-2x2", "plain", n=64, window=3, restart_after=0)
    assert not called


def test_restart_after_validated():
    from specar.samplers.backends import make_backend
    with pytest.raises(ValueError, match="restart_after must be an int in \\[0, 1024\\], got -1"):
        make_backend("scd", restart_after=-1)
    with pytest.raises(ValueError, match="restart_after"):
        make_backend("scd", restart_after=1.5)
