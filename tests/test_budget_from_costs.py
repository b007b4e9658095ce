"""The node budget Hawk and ADT-Tree choose from measured costs (node_budget=0, their default): every
choice under the chi-square suite (tests/test_exactness.py's cases and P_FAIL) and the same-image token pin, the
choice following the costs, an explicit value winning, and the planted shared-noise bug (a kind vLLM met)."""
from types import SimpleNamespace

import pytest
import torch

import specar
from specar.samplers import forward_costs
from specar.samplers.drafters.hawk import drafter as hawk_module
from specar.samplers.randomness import Draws
from support.exactness import check_exact, exactness_model, use_drafter

P_FAIL = 1e-6


def force_budget(monkeypatch, budget):
    """`set_costs` times everything as usual, then takes `budget` (a choice the machine may not make today)."""
    real = forward_costs.best_budget
    monkeypatch.setattr(forward_costs, "best_budget", lambda *costs: {**real(*costs), "node_budget": budget})


@pytest.mark.parametrize("backend,budget,model,setting", [
    ("hawk", None, "v3-2x3-rowend", "cfg"),
    ("hawk", 3, "v3-2x2", "plain"),
    ("adt_tree", None, "v3-2x2", "plain"),
    ("adt_tree", 3, "v3-2x3-rowend", "cfg"),  # below the first trees' depth (6): plan caps it
])
def test_chosen_budget_is_exact_and_reported(monkeypatch, backend, budget, model, setting):
    if budget is not None:
        force_budget(monkeypatch, budget)
    monkeypatch.setattr(forward_costs.BudgetFromCosts, "MEASURED_STEPS", 1)  # tiny images: re-chosen after a step
    (p_value, stat, dof, tv), res = check_exact(backend, model, setting)
    tuned = res.stats.backend_report["tuned"]
    print(f"\n{backend} chose {tuned}: p={p_value:.3g} TV={tv:.4f}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert budget is None or tuned["node_budget"] == budget
    assert tuned["node_budget"] in forward_costs.BudgetFromCosts.BUDGETS and tuned["draft_target_ratio"] > 0
    assert tuned["accept_measured"]


@pytest.mark.parametrize("backend", ["hawk", "adt_tree"])
@pytest.mark.parametrize("budget", [None, 2])
def test_chosen_budget_gives_ar_image(monkeypatch, backend, budget):
    """Same-image mode: whatever budget the costs choose, the tokens are AR's."""
    if budget is not None:
        force_budget(monkeypatch, budget)
    monkeypatch.setattr(forward_costs.BudgetFromCosts, "MEASURED_STEPS", 1)
    mdl = exactness_model("v3-2x3-rowend")
    ar = specar.generate(mdl, "hi", backend="ar", seed=5, batch_size=64, sampling=dict(cfg_scale=2.0))
    res = specar.generate(mdl, "hi", backend=backend, seed=5, batch_size=64, sampling=dict(cfg_scale=2.0))
    assert res.stats.reproducible and torch.equal(res.tokens, ar.tokens)
    assert budget is None or res.stats.backend_report["tuned"]["node_budget"] == budget
    assert res.stats.backend_report["tuned"]["accept_measured"]


class ChainBudgets(forward_costs.BudgetFromCosts):
    """A drafter of chains of budget - 1 drafts, each accepted with a; drafting costs 0.05 forwards a node."""

    def _set_budget(self, budget):
        self.node_budget = budget

    def _step_estimate(self, budget):
        return 0.05 * budget, lambda a: sum(a ** i for i in range(budget))


@pytest.mark.parametrize("accepted,budget", [(1.0, 8), (0.95, 8), (0.1, 2), (0.0, 2)])
def test_budget_follows_the_measured_acceptance(accepted, budget):
    """The budget reported from the guessed acceptance (0.5: 4) is chosen again from the one measured while the
    widest budget runs."""
    drafter = ChainBudgets()
    drafter._tune(0, 0.5)
    drafter.set_costs(dict.fromkeys((1,) + drafter.BUDGETS, 1.0))
    first, widest = drafter.tuned["node_budget"], drafter.BUDGETS[-1]
    committed, rows = 0, 4
    for step in range(drafter.MEASURED_STEPS + 1):
        assert drafter.node_budget == widest and not drafter.tuned["accept_measured"]
        drafter._measure([committed, rows])
        committed += rows * drafter.tokens_at[widest](accepted)  # what a step at the widest budget commits
    assert first == 4 and drafter.node_budget == budget and drafter.tuned["accept_measured"]
    assert drafter.tuned["accept"] == pytest.approx(accepted, abs=0.01)


class Model:  # a model the kept acceptance is keyed by (weakly)
    pass


def test_a_compiled_generation_starts_from_the_acceptance_an_earlier_one_measured():
    """Compiled, the budget measured once is every later generation's budget from its first step (one graph, not one
    per budget a generation measures); eager generations measure their own."""
    model, widest = Model(), ChainBudgets.BUDGETS[-1]

    def generation(compiled, accepted=0.1):
        drafter = ChainBudgets()
        drafter.model = model
        drafter._tune(0, 0.5, "chains")
        drafter.set_costs(dict.fromkeys((1,) + drafter.BUDGETS, 1.0))
        state, committed, budgets = SimpleNamespace(ctx=SimpleNamespace(compiled=compiled, batch=4)), 0, []
        for step in range(drafter.MEASURED_STEPS + 2):
            budgets.append(drafter.plan(state, [committed, 4]))
            committed += 4 * drafter.tokens_at[drafter.node_budget](accepted)
        return budgets

    assert generation(compiled=False)[0] == widest  # eager: nothing kept
    first = generation(compiled=True)
    assert first[0] == widest and first[-1] == 2  # measured at the widest, then its own choice
    assert set(generation(compiled=True, accepted=1.0)) == {2}  # from the first step: the kept acceptance's budget
    assert generation(compiled=False, accepted=1.0)[0] == widest  # eager still measures its own


def test_explicit_budget_wins():
    mdl = exactness_model("v3-2x2")
    for backend in ("hawk", "adt_tree"):
        res = specar.generate(mdl, "hi", backend=specar.make_backend(backend, node_budget=5), seed=1)
        assert res.stats.backend_report is None
    with pytest.raises(ValueError, match="node_budget must be 0 .* or at least 2 .* got 1"):
        specar.generate(mdl, "hi", backend=specar.make_backend("hawk", node_budget=1))


def test_best_budget_follows_the_costs():
    tokens = {2: 1.8, 4: 2.9, 8: 4.2}
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}  # the target's forward costs the same at every width
    cheap = forward_costs.best_budget(flat, dict.fromkeys(tokens, 0.05), tokens)
    assert cheap["node_budget"] == 8 and cheap["beats_ar"] and cheap["no_speedup"] is None
    per_node = {1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5}  # each token costs half a forward
    assert forward_costs.best_budget(per_node, dict.fromkeys(tokens, 0.05), tokens)["node_budget"] == 2
    dear = forward_costs.best_budget(flat, dict.fromkeys(tokens, 4.0), tokens)  # drafting: 4 forwards a step
    assert not dear["beats_ar"] and dear["draft_target_ratio"] == 4.0
    assert "no node budget is predicted to beat AR" in dear["no_speedup"]


class SharedNoiseHawk(hawk_module.HawkDrafter):
    """Planted bug: the acceptance draws reuse the draft's noise, as in vLLM's #47386: a chain's draft of depth d is
    accepted with the very uniform that drew it (its race won with small noise: accepted too often)."""
    shared = {}

    def propose(self, state, plan):
        real = state.noise
        state.noise = lambda *shape: self.shared.setdefault("noise", real(*shape))
        try:
            tree = super().propose(state, plan)
        finally:
            del state.noise
        self.shared["tokens"] = tree.tokens
        return tree


def share_draft_noise(monkeypatch):
    use_drafter(monkeypatch, "hawk", SharedNoiseHawk)
    real, shared = Draws.rand, SharedNoiseHawk.shared

    def rand(self, shape):
        if len(shape) != 3 or "noise" not in shared:
            return real(self, shape)
        noise, tokens = shared.pop("noise"), shared.pop("tokens")  # [B, N, V], [B, N]; node d at depth d
        drawn = noise.gather(2, tokens[:, 1:shape[1] + 1, None])  # the Exp(1) noise that drew each draft
        return 1 - torch.exp(-drawn[:, :, :1].expand(shape))  # its uniform (randomness.exponential_from_uniform)
    monkeypatch.setattr(Draws, "rand", rand)


def test_planted_shared_draft_noise_is_caught(monkeypatch):
    params = dict(vertical_depth=0, candidates=1, horizontal_heads=3, node_budget=4)  # a chain: node d at depth d
    honest = check_exact("hawk", "v4-2x2", "plain", **params)[0]
    share_draft_noise(monkeypatch)
    (p_value, stat, dof, tv), _ = check_exact("hawk", "v4-2x2", "plain", **params)
    print(f"\nplanted shared-noise bug: p={p_value:.3g} TV={tv:.4f} (honest: p={honest[0]:.3g} TV={honest[3]:.4f})")
    assert honest[0] > P_FAIL
    assert p_value < P_FAIL, f"planted shared-noise bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"
