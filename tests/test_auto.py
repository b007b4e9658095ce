"""backend="auto": the window chosen every step stays lossless.

Chi-square exactness as in test_exactness.py (16000 images against exact enumeration, fail at
p < 1e-6) for auto as shipped (both cost models), and for test-side subclasses whose window
policy switches every step from the history (the hardest case for the bookkeeping of drafts
beyond a shrunken window); a planted policy that peeks at the current step's draft is caught.
"""
import pytest
import torch

import specar
from specar.samplers.backends import make_backend
from specar.samplers.drafters import auto as auto_mod
from specar.samplers.drafters.auto.drafter import AutoDrafter
from support.exactness import exactness_model, greedy_and_argmax
from support.exactness import check_exact, mark_long, use_drafter

P_FAIL = 1e-6


class HistorySwitching(AutoDrafter):
    """Switches window every step as a function of the step count and the tokens the previous
    step committed (history only: lossless)."""

    def plan(self, state, hint):
        self.last_tokens = hint[0]  # tokens the previous step committed (the engine's host read)
        return super().plan(state, hint)

    def choose(self, state):
        windows = sorted(self.shapes)
        tokens = self.last_tokens if state.step else 0
        return windows[(state.step + tokens) % len(windows)]


class PeekingPolicy(AutoDrafter):
    """Planted bug: each row's window this step depends on its current draft (verify the drafts
    only where the next one is token 0, else an AR step). The shipped policy picks one window
    for the batch; per row, the same peek is visible to a batched chi-square test."""

    def _enabled(self, state, plan, dpos):
        draft = state.seq.gather(1, state.frontier[:, None] + 1)
        window = torch.where(draft == 0, plan.window, 0)  # [B, 1]: the window of each row, by its draft
        return super()._enabled(state, plan._replace(window=window), dpos)


CASES = [
    (dict(max_window=3, cost_model="forwards"), "v3-2x2", "plain"),
    (dict(max_window=4, cost_model="measured"), "v3-2x3-rowend", "cfg"),
    (dict(max_window=3, cost_model="measured", init="sample_above"), "v4-2x2", "mixed"),
]


# `make test` runs the first case (the planted peek's correct twin), `make test-long` the others (pytest.mark.long)
@pytest.mark.parametrize("params,model_name,setting", mark_long(CASES, (0,), several_names=True))
def test_auto_is_exact(params, model_name, setting):
    (p_value, stat, dof, tv), res = check_exact("auto", model_name, setting, **params)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    report = res.stats.backend_report
    assert sum(report["steps_per_window"].values()) == res.stats.nfe


@pytest.mark.parametrize("model_name,setting,init", mark_long([("v3-2x2", "plain", "random"),
                                                               ("v3-2x3-rowend", "topk", "repeat_left"),
                                                               ("v4-2x2", "cfg", "sample_left")], (2,), several_names=True))
def test_switching_every_step_is_exact(monkeypatch, model_name, setting, init):
    use_drafter(monkeypatch, "auto", HistorySwitching)
    (p_value, stat, dof, tv), res = check_exact("auto", model_name, setting, max_window=3, init=init)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    used = res.stats.backend_report["steps_per_window"]
    assert len(used) >= 2, f"the policy did not switch: {used}"


def test_planted_peek_is_caught(monkeypatch):
    use_drafter(monkeypatch, "auto", PeekingPolicy)
    (p_value, stat, dof, tv), _ = check_exact("auto", "v3-2x2", "plain", max_window=3, cost_model="forwards")
    print(f"\nplanted peek: p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"a window chosen from the current draft went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_greedy_gives_the_argmax_sequence():
    mdl = exactness_model("v3-2x3-rowend")
    tokens, argmax_image, _ = greedy_and_argmax(mdl, "auto", 32, max_window=4)
    assert (tokens == argmax_image).all()


def test_candidate_windows_and_bad_values():
    assert auto_mod.candidate_windows(64) == (64, 32, 16, 8, 4, 2, 0)
    assert auto_mod.candidate_windows(24) == (24, 16, 8, 4, 2, 0)
    assert auto_mod.candidate_windows(1) == (1, 0)
    mdl = exactness_model("v3-2x2")
    with pytest.raises(ValueError, match="max_window must be an int in \\[1, 128\\], got 0"):
        specar.generate(mdl, "hi", backend=specar.make_backend("auto", max_window=0))
    with pytest.raises(ValueError, match="cost_model must be one of measured, forwards"):
        specar.generate(mdl, "hi", backend=specar.make_backend("auto", cost_model="fast"))


def test_forwards_cost_model_is_deterministic_and_uses_the_largest_window():
    mdl = exactness_model("v3-2x3-rowend")
    a = specar.generate(mdl, "hi", backend=specar.make_backend("auto", cost_model="forwards"), seed=3, batch_size=8)
    b = specar.generate(mdl, "hi", backend=specar.make_backend("auto", cost_model="forwards"), seed=3, batch_size=8)
    assert torch.equal(a.tokens, b.tokens)
    default = make_backend("auto").typed_params.max_window
    assert list(a.stats.backend_report["steps_per_window"]) == [str(default)]  # max_window's default


def test_calibration_is_cached_per_model_and_leaves_the_tokens_alone():
    """The calibration forwards write cache slots past the committed prefix only: a generation
    with a fresh calibration and one with the cached table give the same tokens under the
    deterministic cost model... and the measured costs are timed once per setting, kept by the
    engine per model (never written into the model)."""
    from specar.samplers.forward_costs import _FORWARD_COSTS
    mdl = exactness_model("v4-2x2")
    _FORWARD_COSTS.pop(mdl, None)
    specar.generate(mdl, "hi", backend="auto", seed=5, batch_size=4)
    costs = _FORWARD_COSTS[mdl]
    assert len(costs) == 1 and all(t > 0 for t in next(iter(costs.values())).values())
    assert not any("cost" in k for k in vars(mdl))
    specar.generate(mdl, "hi", backend="auto", seed=6, batch_size=4)
    assert len(_FORWARD_COSTS[mdl]) == 1
