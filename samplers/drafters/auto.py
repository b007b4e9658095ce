"""`auto`: the Jacobi family with its window chosen every step from the device's measured cost.

The drafter is SCD with maximal coupling (adaptive continuation): drafts are the previous step's
MRS outputs, verified by `verify_chain`. What `auto` adds is the choice of the window W_t of
each step among a few fixed shapes (AR's single slot, and windows up to `max_window`), made to
maximise the predicted tokens committed per second:

    rate(W) = E[tokens committed by a step with window W] / cost(W)

- E[tokens | W]: the mean tokens committed per step over this generation's steady steps with
  window W (not the first `WARMUP_STEPS` steps, nor a step right after a switch: both verify
  fresh `init` drafts), shrunk towards `prior_tokens_per_step(W)` by `PRIOR_STEPS` pseudo-steps.
  A step run with a larger window V also counts, for every smaller candidate W, as a step that
  committed min(n, W + 1) tokens per row (n: what it committed): the first W drafts of V's chain
  are the drafts a W-window step would have verified, so a window that is never run is not
  judged by its prior alone (before this, auto kept W=32 with `sample_above` drafts because the
  prior underrated W=16, which it then never ran: docs/BENCHMARKS.md). It overrates W a little
  (with a window of W the drafts near its end are refined fewer times), never underrates it.
- cost(W): the engine's calibration of the model forward at W's shape (`cost_shapes`, timed once
  per model, batch, guidance, compile setting and thread count, see engine.py), times the moving
  average of measured step time / calibrated forward time over this generation's steps. With
  ``cost_model="forwards"`` every step costs the same: auto then minimises forward passes (what
  a GPU, where a forward's cost hardly depends on its tokens, wants), deterministically.
- the current window is kept unless another is predicted `SWITCH_MARGIN` better.

Why it stays lossless: the window of step t is a function of what happened before step t (the
counts, the clock), never of step t's drafts or random draws. Conditioned on that history each
draft in the window is still distributed as the q recorded for it, so every MRS check is exact
(docs/ARCHITECTURE.md). Drafts beyond a shrunken window keep their tokens and q until a later
window reaches them; a window that grows drafts the new positions by `init` first.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from .base import LoopState
from .jacobi import INIT_ABOVE_PAPER, INIT_HELP, JacobiDrafter, JacobiParams, JacobiPlan, JacobiState, restart_param
from .params import INITS, MAX_WINDOW, Method, StepCost, chain_tokens, param

PRIOR_STEPS = 8.0  # weight of the prior, in steps
COST_EMA = 0.25  # weight of the newest step in the moving average of step time / forward time
SWITCH_MARGIN = 1.1
WARMUP_STEPS = 4  # steps not counted in tokens per step


def prior_tokens_per_step(window: int) -> float:
    """The prior of tokens committed per step with a window: 1 + 7 (1 - exp(-W / 24)), a fit of
    SCD's measured curve on the demo model (docs/BENCHMARKS.md); each generation corrects it."""
    return 1.0 + 7.0 * (1.0 - math.exp(-window / 24.0))


def candidate_windows(max_window: int) -> tuple:
    """0 (plain AR), then powers of two up to `max_window` (and `max_window` itself), largest first."""
    ws = {0, max_window} | {w for w in (2, 4, 8, 16, 32, 64, 128) if w < max_window}
    return tuple(sorted(ws, reverse=True))


@dataclass(frozen=True)
class AutoParams(JacobiParams):
    max_window: int = param(32, "the largest window auto may choose (it picks among AR's single slot and windows up "
                            "to this)", lo=1, hi=MAX_WINDOW, sizes=True, essential=True)
    cost_model: str = param("measured", "measured: maximise tokens per second on this device (the forward timed once "
                            "per loaded model, then every step; with same_image_as_ar off the image follows that "
                            "calibration); forwards: minimise forward passes (deterministic; what a GPU wants)",
                            choices=("measured", "forwards"))
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_PAPER)
    restart_after: int = restart_param()
    redraft: ClassVar[str] = "maximal"  # SCD / adaptive continuation
    coupling_strength: ClassVar[float] = 1.0

    @property
    def windows(self) -> tuple:
        return candidate_windows(self.max_window)


@dataclass
class AutoState(JacobiState):
    """The Jacobi state and the last step's counts (the host hint auto's policy reads)."""

    committed: Optional[torch.Tensor] = None  # [2 + windows] tokens, rows, then each candidate window's credit


class AutoDrafter(JacobiDrafter):
    def __init__(self, params: AutoParams, model, sampling):
        super().__init__(params, model, sampling)
        self.cost_model = params.cost_model
        self.forward_cost = {}  # window -> calibrated seconds of a forward (set_costs)
        self.slowdown = 1.0  # moving average of (step time / its forward's calibrated time)
        self.used = {w: 0 for w in self.shapes}  # steps per window
        self.order = tuple(sorted(self.shapes))  # the candidate windows, ascending: the credits' order
        self.order_t = torch.tensor(self.order, dtype=torch.long, device=model.device)

    # -- costs ---------------------------------------------------------------------------------
    def cost_shapes(self) -> dict:
        """The chain of each window (what the engine times once per model / device / batch)."""
        return {w: shape[1] for w, shape in self.shapes.items()} if self.cost_model == "measured" else {}

    def set_costs(self, seconds: dict) -> None:
        self.forward_cost = dict(seconds)

    def cost(self, window: int) -> float:
        """Seconds per step: the calibrated forward times the measured ratio of step time to
        calibrated forward time (moving average over this generation's steps). A ratio rather
        than an added overhead: when another process slows the machine down, a forward's cost
        grows with its size, and the ratio keeps the windows' relative costs."""
        if self.cost_model == "forwards":
            return 1.0
        return self.forward_cost.get(window, 1.0) * self.slowdown

    # -- the choice ----------------------------------------------------------------------------
    def _new_state(self, state: LoopState, first) -> "AutoState":
        ds = super()._new_state(state, first)
        # the last step's [tokens, rows, then per candidate window (self.order) the tokens it would have committed]
        committed = torch.zeros(2 + len(self.order), dtype=torch.long, device=state.device)
        return AutoState(**{f.name: getattr(ds, f.name) for f in dataclasses.fields(ds)}, committed=committed)

    def start(self, state: LoopState, first, p0):
        self.tokens = {w: 0.0 for w in self.shapes}  # window -> tokens per step, summed over its counted steps
        self.counted = {w: 0 for w in self.shapes}
        self.prev_step = None  # the previous step: (window, start time, whether it switched window)
        return super().start(state, first, p0)

    def host_hint(self, state: LoopState):
        return state.draft.committed  # auto drafts chains only (no proactive tree rows to count)

    def expected_tokens(self, window: int) -> float:
        """Tokens per step expected from `window`: the mean over its steps so far in this
        generation, shrunk towards the prior by PRIOR_STEPS pseudo-steps."""
        n = self.counted[window]
        return (PRIOR_STEPS * prior_tokens_per_step(window) + self.tokens[window]) / (PRIOR_STEPS + n)

    def choose(self, state: LoopState) -> int:
        """The window of the best predicted rate; the current one is kept unless another beats it
        by SWITCH_MARGIN (a switch costs: the drafts a new window reaches are fresh). It reads only
        what earlier steps left (counts, costs), never `state`'s drafts of this step: a choice
        that depended on them would bias which drafts get verified (tests/test_auto.py plants one)."""
        rate = {w: self.expected_tokens(w) / self.cost(w) for w in self.shapes}
        best = max(self.shapes, key=lambda w: (rate[w], w))
        return best if rate[best] > SWITCH_MARGIN * rate[self.window] else self.window

    def plan(self, state: LoopState, hint: list) -> JacobiPlan:
        """The previous step's tokens and wall time into the estimates, then this step's window (host only)."""
        now = time.perf_counter()
        tokens, rows, credits = hint[0], hint[1], hint[2:]
        if self.prev_step is not None and rows:  # the previous step: its tokens and its wall time
            w, t, switched = self.prev_step
            # the first steps, and a step right after a switch, verify fresh `init` drafts: not the window's rate
            if state.step > WARMUP_STEPS and not switched:
                self.tokens[w] += tokens / rows
                self.counted[w] += 1
                for smaller, credit in zip(self.order, credits):  # what each smaller window would have committed
                    if smaller < w:
                        self.tokens[smaller] += credit / rows
                        self.counted[smaller] += 1
            if w in self.forward_cost:
                self.slowdown += COST_EMA * ((now - t) / self.forward_cost[w] - self.slowdown)
        window = self.choose(state)
        switched = window != self.window
        # positions the new window reaches for the first time get drafted by `init` (in `propose`)
        grow = switched and self.shapes[window][0] > self.shapes[self.window][0]
        self.window = window
        self.used[window] += 1
        self.prev_step = (window, now, switched)
        return JacobiPlan(window, grow=grow)

    def observe(self, state: LoopState, plan, tree, verdict, p_all, out, previous_frontier):
        ds = super().observe(state, plan, tree, verdict, p_all, out, previous_frontier)
        active = state.active
        n = torch.where(active, verdict.n_accepted + 1, 0)
        credits = torch.minimum(n[None, :], self.order_t[:, None] + 1).sum(1)  # [windows]: min(n, W + 1) per row
        ds.committed = torch.cat([torch.stack([n.sum(), active.sum()]), credits])
        return ds

    def report(self) -> dict:
        """What auto chose and why: steps per window, each window's cost and the expected tokens
        per step at the end of the generation (the last estimate)."""
        return {
            "cost_model": self.cost_model,
            "steps_per_window": {str(w): n for w, n in sorted(self.used.items()) if n},
            "tokens_per_step": {str(w): round(self.tokens[w] / n, 2) for w, n in sorted(self.counted.items()) if n},
            "step_over_forward": round(self.slowdown, 3),
            "step_cost_ms": {str(w): round(1e3 * self.cost(w), 3) for w in sorted(self.shapes)}
            if self.cost_model == "measured" else None,
            "expected_tokens_per_step": {str(w): round(self.expected_tokens(w), 2) for w in sorted(self.shapes)},
            "rule": "each step: the window maximising expected tokens per step / step cost, from earlier steps only",
        }


def auto_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """The windows auto chose, each with its share of the steps (`steps_per_window` of the backend reports)."""
    counts: dict = {}
    for report in reports:
        for w, n in report.get("steps_per_window", {}).items():
            counts[int(w)] = counts.get(int(w), 0) + n
    if not counts:
        raise KeyError("steps_per_window")
    total = sum(counts.values())
    return StepCost(tuple((chain_tokens(w, row_codes) if w else 1, n / total) for w, n in sorted(counts.items())))


AUTO = Method("auto", "Auto", "SCD whose window is chosen every step from this device's measured step cost and the "
              "acceptance seen so far (lossless; docs/BENCHMARKS.md)", AutoParams, AutoDrafter,
              step_cost=auto_step_cost)

__all__ = ["AutoDrafter", "AutoParams", "AUTO", "candidate_windows"]

