"""`auto`'s costs re-measured during the generation and its online init choice.

Chi-square exactness (as tests/test_auto.py: 16000 images against exact enumeration, fail at
p < 1e-6) for the init chosen per step (a policy that switches init and window every step from the
history, and auto as shipped with `adapt_init` on and its trial schedule shortened so that it acts on
these tiny images), for windows chosen from a clock that makes no sense (probes every step), and a
planted bug caught: drafts of the step's init recorded with another init's q. Host-only checks of the
cost policy: one load spike does not send auto to AR for the rest of a generation, and a calibration
that one busy moment distorted is corrected by probes (auto leaves AR).
"""
import importlib
import pkgutil
import random
from types import SimpleNamespace

import pytest
import torch

from specar.samplers.backends import make_backend
from specar.samplers.drafters import auto as auto_mod
from specar.samplers.drafters.auto.drafter import AutoDrafter
from specar.samplers.target import SamplingParams
from support.exactness import check_exact, exactness_model, mark_long, use_drafter
from support.calls import generate_kwargs

P_FAIL = 1e-6


class InitSwitching(AutoDrafter):
    """Switches init every step and the window every third step, as functions of the step count
    (history only: lossless)."""

    def choose(self, state):
        return 0 if state.step % 3 == 2 else max(self.shapes)  # an AR step one time in three (then a grow)

    def choose_init(self, state, window):
        return self.trials.inits[state.step % len(self.trials.inits)]


class RecordsTheConfiguredQ(InitSwitching):
    """Planted bug: drafts drawn by the step's init, but recorded with the q the configured init would have
    recorded there (repeat_left: one-hot on the token to the left), whichever init drew them."""

    def _init(self, state, window, pos, need, init=None):
        if not window or init in (None, self.init):
            return super()._init(state, window, pos, need, init)
        super()._init(state, window, pos, need, self.init)  # repeat_left: no random draws
        configured_q = state.draft.dist[state.rows[:, None], pos % self.ring].clone()
        super()._init(state, window, pos, need, init)
        self._write(state, pos, need & state.ctx.layout.is_img[pos], dists=configured_q)


class MadClock(AutoDrafter):
    """Step times from a host generator of their own (independent of the drafts): windows chosen from
    nonsense costs, probes every step."""

    def reset_policy(self):
        super().reset_policy()
        rng, now = random.Random(7), [0.0]

        def clock():
            now[0] += rng.choice([1e-4, 1e-3, 1e-2, 1.0])
            return now[0]
        self.clock = clock


def patch_auto(monkeypatch, name, value):
    """Set one of auto's constants in every module of the package that reads it (each imports its own binding)."""
    names = [f"{auto_mod.__name__}.{m.name}" for m in pkgutil.iter_modules(auto_mod.__path__)]
    modules = [importlib.import_module(name) for name in names]
    holders = [m for m in modules if hasattr(m, name)]
    assert holders, name
    for module in holders:
        monkeypatch.setattr(module, name, value)


@pytest.fixture
def eager_schedule(monkeypatch):
    """Auto's schedules shortened so that its choices act within these 2x2 / 2x3 images (in every module of the
    package that reads them)."""
    for name, value in (("WARMUP_STEPS", 0), ("PROBE_EVERY", 1), ("INIT_TRIAL_AFTER", 0), ("INIT_TRIAL_EVERY", 2),
                        ("INIT_TRIAL_STEPS", 1), ("INIT_TRIAL_SEEN", 0), ("TRIAL_BELOW", 10.0)):
        patch_auto(monkeypatch, name, value)


# max_window=2 (windows 2 and 0): positions enter the window during the generation, drafted by the step's init
@pytest.mark.parametrize("model_name,setting,init", mark_long([("v3-2x3-rowend", "plain", "random"),
                                                               ("v3-2x3-rowend", "topk", "sample_above"),
                                                               ("v4-2x2", "cfg", "sample_left")], (0,), several_names=True))
def test_init_switching_every_step_is_exact(monkeypatch, model_name, setting, init):
    use_drafter(monkeypatch, "auto", InitSwitching)
    (p_value, stat, dof, tv), res = check_exact("auto", model_name, setting, max_window=2, init=init, adapt_init=True)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert len(res.stats.backend_report["steps_per_init"]) == 2, res.stats.backend_report["steps_per_init"]


def test_planted_init_q_mismatch_is_caught(monkeypatch):
    use_drafter(monkeypatch, "auto", RecordsTheConfiguredQ)
    (p_value, stat, dof, tv), _ = check_exact("auto", "v3-2x3-rowend", "plain", max_window=2, init="repeat_left",
                                              adapt_init=True)
    print(f"\nplanted init q mismatch: p={p_value:.3g} TV={tv:.4f}")
    assert p_value < P_FAIL, f"drafts recorded with another init's q went unnoticed: p={p_value:.2e} TV={tv:.4f}"


@pytest.mark.parametrize("model_name,setting", mark_long([("v3-2x3-rowend", "plain"), ("v4-2x2", "cfg")], (0,),
                                                         several_names=True))
def test_shipped_policy_with_short_schedules_is_exact(eager_schedule, model_name, setting):
    """Trial blocks and the preference they revise, on the forwards cost model (the drafting windows win)."""
    (p_value, stat, dof, tv), res = check_exact("auto", model_name, setting, max_window=2, adapt_init=True,
                                                cost_model="forwards")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    report = res.stats.backend_report
    assert len(report["steps_per_init"]) == 2, report  # a trial block ran


def test_windows_from_a_mad_clock_are_exact(monkeypatch, eager_schedule):
    use_drafter(monkeypatch, "auto", MadClock)
    (p_value, stat, dof, tv), res = check_exact("auto", "v3-2x3-rowend", "plain", max_window=4)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    report = res.stats.backend_report
    assert len(report["steps_per_window"]) >= 2 and report["probe_steps"], report


# -- the cost policy on the host (no model forward: plan() driven with made-up counts and step times) --------
class _Step:
    """What auto's `plan` reads of the loop state: the step count, and whether the step runs compiled."""
    ctx = SimpleNamespace(compiled=False)

    def __init__(self, step):
        self.step = step


def _policy(forward_cost: dict):
    model = exactness_model("v4-2x2")
    drafter = make_backend("auto", max_window=32).make_drafter(model, SamplingParams())
    drafter.set_costs(forward_cost)
    drafter.reset_policy()
    return drafter


def _run(drafter, step_time, tokens, steps: int) -> list:
    """plan() for `steps` steps; step_time(step, window) seconds per step, tokens(window) committed per step
    (one row); returns the windows chosen."""
    now, chosen = [0.0], []
    drafter.clock = lambda: now[0]
    hint = [0, 0] + [0] * len(drafter.policy.order)
    for s in range(steps):
        w = drafter.plan(_Step(s), hint).window
        chosen.append(w)
        now[0] += step_time(s, w)
        n = tokens(w)
        hint = [n, 1] + [min(n, v + 1) for v in drafter.policy.order]
    return chosen


def test_one_load_spike_does_not_send_auto_to_ar():
    true_cost = {w: 0.010 + 0.0005 * w for w in auto_mod.candidate_windows(32)}  # seconds per step
    drafter = _policy(true_cost)

    def step_time(s, w):
        return true_cost[w] * (50.0 if s == 10 else 1.0)  # another process takes the machine for one step
    chosen = _run(drafter, step_time, lambda w: min(w + 1, 12), 80)
    assert chosen[20:].count(0) <= 8, chosen  # at most the probes of AR (every 8 steps, then less often)
    assert max(set(chosen[20:]), key=chosen[20:].count) > 0, chosen
    assert drafter.report()["fell_back_to_ar"] is None


def test_a_distorted_calibration_is_corrected_and_a_fallback_is_reported():
    true_cost = {w: 0.010 + 0.0005 * w for w in auto_mod.candidate_windows(32)}
    distorted = {w: c * (1.0 if w == 0 else 30.0) for w, c in true_cost.items()}  # every drafting window 30x
    drafter = _policy(distorted)
    chosen = _run(drafter, lambda s, w: true_cost[w], lambda w: min(w + 1, 12), 120)
    assert chosen[0] == 0, chosen  # the calibration alone says AR
    # probes measured the drafting windows: auto left AR (an AR step now and then is a probe of AR)
    assert chosen[-40:].count(0) <= 2, chosen
    assert drafter.report()["fell_back_to_ar"] is None
    # a machine where drafting really does not pay: auto stays on AR and the report says so in one line
    slow = {w: 0.010 * (1.0 if w == 0 else 40.0) for w in true_cost}
    drafter = _policy(slow)
    chosen = _run(drafter, lambda s, w: slow[w], lambda w: min(w + 1, 12), 120)
    line = drafter.report()["fell_back_to_ar"]
    assert chosen.count(0) > 100 and line and line.startswith("auto fell back to plain AR for"), (chosen, line)
    assert "\n" not in line


def test_the_node_summary_says_when_auto_fell_back_to_ar():
    """The sampler node's notes (under its one line) carry the fallback line of auto's report."""
    import dataclasses

    from specar.nodes.report import summary
    from specar.samplers.api import generate
    res = generate(exactness_model("v4-2x2"), "hi", backend=make_backend("auto", max_window=2), seed=0)
    line = "auto fell back to plain AR for 3 of 4 steps: (the report's line)"
    stats = dataclasses.replace(res.stats, backend_report={**res.stats.backend_report, "fell_back_to_ar": line})
    assert line in summary(stats)[1]
    stats = dataclasses.replace(res.stats, backend_report={**res.stats.backend_report, "fell_back_to_ar": None})
    head, notes = summary(stats)
    assert "fell back" not in " ".join([head, *notes])


def test_the_next_generation_starts_where_the_last_one_ended(monkeypatch):
    """Memory (`AutoMemory`): on a machine where drafting steps cost 40x an AR step, the first generation starts at
    the largest window and probes AR (unmeasured AR is the first probe); the generations after it on the same model
    and settings start from what the earlier ones measured, until one starts at AR and stays there, and each says
    how many generations are behind it. cost_model=forwards keeps no memory (deterministic). The tokens stay AR's
    (same image as AR)."""
    import specar
    from specar.model_loaders.tiny import tiny_model
    mdl = tiny_model(16, (6, 6), seed=2, row_end=True)
    now, windows = [0.0], []
    plan = AutoDrafter.plan

    def timed_plan(self, state, hint):  # the step that just ended took its window's time
        if self.last is not None:
            now[0] += 0.001 if self.last.window == 0 else 0.040
        out = plan(self, state, hint)
        windows[-1].append(out.window)
        return out
    monkeypatch.setattr(AutoDrafter, "plan", timed_plan)
    monkeypatch.setattr(AutoDrafter, "clock", staticmethod(lambda: now[0]))
    auto_mod._MEMORY.pop(mdl, None)
    kw = dict(backend="auto", seed=4, cfg_scale=2.0)
    ar = specar.generate(mdl, "a cat", backend="ar", seed=4, sampling=dict(cfg_scale=2.0)).tokens
    reports = []
    for _ in range(3):
        windows.append([])
        out = specar.generate(mdl, "a cat", **generate_kwargs(**kw))
        assert torch.equal(out.tokens, ar)
        reports.append(out.stats.backend_report)
    assert [r["earlier_generations"] for r in reports] == [0, 1, 2]
    assert windows[0][0] == max(auto_mod.candidate_windows(16)) and 0 in windows[0], windows[0]
    assert windows[2][0] == 0 and windows[2].count(0) > 0.8 * len(windows[2]), windows[2]
    assert reports[2]["fell_back_to_ar"]
    c = specar.generate(mdl, "a cat", **generate_kwargs(cost_model="forwards", **kw))
    assert c.stats.backend_report["earlier_generations"] == 0


def test_a_larger_window_the_prior_underrates_is_explored():
    """Credits measure every window smaller than the one auto runs, never a larger one. A run that measured windows
    up to 8 well (9 tokens per step at 8) while 16 would commit 15 per step, which the demo-fitted formula rates at
    4.6: 16's prior grows from 8's estimate as the formula grows, and probe blocks measure it; auto moves to 16
    (planted: the formula alone as 16's prior and no upward probe blocks, it stays at 8)."""
    true_cost = {w: 0.010 + 0.0005 * w for w in auto_mod.candidate_windows(16)}
    drafter = make_backend("auto").make_drafter(exactness_model("v4-2x2"), SamplingParams())  # max_window 16
    drafter.set_costs(true_cost)
    drafter.reset_policy()
    for w in drafter.policy.order:  # as if earlier steps had measured the windows up to 8
        if w <= 8:
            drafter.policy.tokens[w], drafter.policy.counted[w] = 50 * min(w + 1, 15), 50
    drafter.window = drafter.reach = drafter.policy.choice = 8
    chosen = _run(drafter, lambda s, w: true_cost[w], lambda w: min(w + 1, 15), 120)
    assert chosen[-40:].count(16) >= 35, chosen
