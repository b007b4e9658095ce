"""Seconds per forward at each shape an adaptive drafter may choose (`Drafter.cost_shapes` / `set_costs`),
timed on the generation's session once per model, batch, guidance, compile setting, thread count and target
mode (batch-invariant forwards cost more), and kept per model while it lives (never written into the model);
and the node budget a trained drafter runs, chosen from those timings and its own network's (`best_budget`)."""
from __future__ import annotations

import statistics
import time
import weakref

import torch

_FORWARD_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_DRAFT_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {drafter setting: seconds}
# model -> {(drafter setting, batch): the acceptance a compiled generation measured}: later compiled generations start
# from it, so they run one budget (one compiled graph) instead of compiling the budget each one measures
_MEASURED_ACCEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def calibrate(ctx, session, sync, shapes: dict) -> dict:
    """Seconds per forward of each of an adaptive drafter's `shapes` ({choice: parents}) in the generation `ctx`
    (a run_state.RunContext), timed now unless kept from an earlier generation (with the shapes pinned: every shape
    costs one forward of the pinned width). The forwards write only cache slots past the committed prefix, which
    every later forward overwrites before reading: the generation is unchanged."""
    model, plan = ctx.model, ctx.same_image
    kept = _FORWARD_COSTS.setdefault(model, {})
    key = (ctx.batch, session.cfg, ctx.compiled, torch.get_num_threads(), plan.mode, plan.pin_width,
           tuple(len(parents) for parents in shapes.values()))
    if key not in kept:
        with plan.mode():
            if plan.pin_width is None:
                kept[key] = time_forwards(model, session, shapes, ctx.batch, sync)
            else:
                pinned = time_forwards(model, session, {"pinned": [-1] * plan.pin_width}, ctx.batch, sync)["pinned"]
                kept[key] = dict.fromkeys(shapes, pinned)
    return kept[key]


def time_forwards(model, session, shapes: dict, batch: int, sync, rounds: int = 5) -> dict:
    """Seconds per forward of each shape: the fastest of `rounds` timings taken round-robin
    over the shapes (a load spike from another process then hits one timing of every shape,
    and the minimum drops it), smoothed by the least-squares line cost = a + b * tokens
    (b >= 0): a forward's cost grows with its tokens, and one bad timing must not make a
    bigger shape look cheaper than a smaller one (or the reverse)."""
    best = {w: float("inf") for w in shapes}
    for r in range(rounds + 1):  # round 0 warms up
        for w, parents in shapes.items():
            tokens = torch.zeros(batch, len(parents), dtype=torch.long, device=model.device)
            sync()
            t = time.perf_counter()
            model.forward(session, tokens, parents)
            sync()
            if r:
                best[w] = min(best[w], time.perf_counter() - t)
    n, y = [len(parents) for parents in shapes.values()], list(best.values())
    slope = max(statistics.linear_regression(n, y).slope, 0.0) if len(set(n)) > 1 else 0.0
    base = max(statistics.fmean(y) - slope * statistics.fmean(n), min(y) * 0.5)
    return {w: base + slope * len(parents) for w, parents in shapes.items()}


def draft_seconds(model, key, run, rounds: int = 5) -> float:
    """Seconds of one `run()` (a drafter network's forwards of one step): the fastest of `rounds` after a warm-up,
    kept per model and `key` (the drafter's setting, threads added) like the target's timings."""
    kept = _DRAFT_COSTS.setdefault(model, {})
    key = (key, torch.get_num_threads())
    if key not in kept:
        sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
        best = float("inf")
        for r in range(rounds + 1):
            sync()
            t = time.perf_counter()
            run()
            sync()
            if r:
                best = min(best, time.perf_counter() - t)
        kept[key] = best
    return kept[key]


def best_budget(target_s: dict, draft_s: dict, tokens: dict) -> dict:
    """The node budget of the best predicted rate, tokens per step / (target forward + drafting), among the
    candidates (`tokens`: budget -> expected tokens per step; `target_s`: budget -> seconds, 1 included: AR's
    forward), and what decided it (the drafter's `report`): the drafting / target-forward cost ratio and the
    predicted speed-up over AR (verification's share of a step left out: the prediction is optimistic, so "no
    budget beats AR" is said only where even it fails)."""
    rate = {b: tokens[b] / (target_s[b] + draft_s[b]) for b in tokens}
    best = max(rate, key=lambda b: (rate[b], -b))
    speedup, ratio = rate[best] * target_s[1], draft_s[best] / target_s[best]
    return {"node_budget": best, "draft_target_ratio": round(ratio, 3), "predicted_speedup": round(speedup, 2),
            "beats_ar": speedup > 1.0, "no_speedup": None if speedup > 1.0 else
            f"no node budget is predicted to beat AR on this device (best {speedup:.2f}x at node_budget {best}, "
            f"its drafting {ratio:.2f}x a target forward): auto is faster here"}


class BudgetFromCosts:
    """A trained drafter's node_budget=0 (a mixin of Hawk's and ADT-Tree's): `_tune(node_budget, accept)` in the
    constructor, the widest candidate until the engine's timings arrive (`set_costs`, after `start`, which sets
    `batch`); then for each candidate `_set_budget(b)` and `_step_estimate(b)` (drafting seconds of a step, expected
    tokens per step as a function of the acceptance a), the best one at the drafter's guess `accept` reported; the
    widest run for MEASURED_STEPS steps, then the best at the a their committed tokens show, once (past steps only,
    before the next step's draws: lossless); a compiled generation starts from the a an earlier one measured. An
    explicit node_budget is kept as it is (no timing)."""

    BUDGETS = (2, 3, 4, 6, 8)  # the candidates (8: the default before the budget was chosen by costs)
    MEASURED_STEPS = 8

    def _tune(self, node_budget: int, accept: float, setting=None) -> None:
        self.tuned, self.accept, self.reads, self.setting = (None if node_budget else {}), accept, [], repr(setting)
        self._set_budget(node_budget or self.BUDGETS[-1])

    def cost_shapes(self) -> dict:  # chains of each width (a forward's cost follows its token count)
        return {} if self.tuned is None else {w: [-1] + list(range(w - 1)) for w in (1,) + self.BUDGETS}

    def set_costs(self, seconds: dict) -> None:
        self.target_s, self.draft_s, self.tokens_at = seconds, {}, {}
        for b in self.BUDGETS:
            self._set_budget(b)
            self.draft_s[b], self.tokens_at[b] = self._step_estimate(b)
        self._choose(measured=False)

    def _choose(self, measured: bool) -> None:
        tokens = {b: at(self.accept) for b, at in self.tokens_at.items()}
        self.tuned = {**best_budget(self.target_s, self.draft_s, tokens), "accept": round(self.accept, 3),
                      "accept_measured": measured}
        # measured at the widest budget: its deep links (a narrow chain measures the first, hardest link alone)
        self._set_budget(self.tuned["node_budget"] if measured else self.BUDGETS[-1])

    def host_hint(self, state) -> torch.Tensor:  # [the rows' committed positions, active rows]
        return torch.stack([state.frontier.sum(), state.active.sum()])

    def plan(self, state, hint) -> int:
        self._measure_step(state, hint[-2:])  # may choose the node budget again (once), before the step's draws
        return self.node_budget  # the tree's size: one compiled graph per budget

    def _measure_step(self, state, read: list, expected=None) -> None:
        """`_measure`, and compiled: the a an earlier generation measured taken at once, this one's kept. Nothing
        once the budget is chosen (every later step)."""
        if self.tuned is None or self.tuned["accept_measured"]:
            return
        kept = _MEASURED_ACCEPT.setdefault(self.model, {}) if state.ctx.compiled else {}
        key = (self.setting, state.ctx.batch)
        if key in kept:
            self.accept = kept[key]  # an earlier generation's, not this one's draws: lossless
            self._choose(measured=True)
            return
        self._measure(read, expected)
        if self.tuned["accept_measured"]:
            kept[key] = self.accept

    def _measure(self, read: list, expected=None) -> None:  # expected: a -> the step's tokens (None: its budget's)
        if self.tuned is None or self.tuned["accept_measured"]:
            return
        self.reads.append((read, expected or self.tokens_at[self.node_budget]))
        if len(self.reads) > self.MEASURED_STEPS:  # the a at which the steps' rows expect the tokens they committed
            committed, lo, hi = read[0] - self.reads[0][0][0], 0.0, 1.0
            for _ in range(20):  # bisection: expected tokens grow with a
                self.accept = (lo + hi) / 2
                short = sum(n * e(self.accept) for (_, n), e in self.reads[:-1]) < committed
                lo, hi = (self.accept, hi) if short else (lo, self.accept)
            self._choose(measured=True)

    def report(self):
        return None if self.tuned is None else {"tuned": self.tuned}
