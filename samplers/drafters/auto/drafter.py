"""`AutoDrafter`: the Jacobi drafter whose plan the policy objects choose from the counts its `observe` leaves."""
from __future__ import annotations

import dataclasses
import time
import weakref
from collections import namedtuple
from dataclasses import dataclass
from typing import Optional

import torch

from ...run_state import LoopState
from ..base import AdaptiveDrafter
from ..jacobi.drafter import JacobiDrafter, JacobiPlan, JacobiState
from .cost import CostModel
from .trials import TRIAL_BELOW, InitTrials, candidate_inits
from .window import PROBE_EVERY, WARMUP_STEPS, AutoMemory, WindowPolicy


@dataclass(frozen=True)
class HostCounts:
    """The last step's counts, as the host read them (`AutoState.counts`, then `host_hint`'s want_tree)."""
    tokens: int  # tokens the chain committed, over the active rows (a row whose branch won counts one)
    rows: int  # active rows
    credits: tuple  # per candidate window, ascending: sum over rows of min(tokens, W + 1)
    tree_rows: int = 0  # rows that carried the proactive branches
    tree_added: int = 0  # tokens the branches added beyond the chain's (where a branch won depth 1)
    want_tree: int = 0  # rows that want the branches on the next step

    @classmethod
    def read(cls, hint: list, windows: int) -> "HostCounts":
        return cls(hint[0], hint[1], tuple(hint[2:2 + windows]), *(list(hint[2 + windows:5 + windows]) + [0] * 3)[:3])


# what `plan` decided for a step: `started`, the clock then; `fresh`, its window reached positions no step of the
# last two drafted (not counted); `scored`, it drafted by the init of the step before it (scores that init)
Step = namedtuple("Step", "window started fresh init scored tree")


@dataclass
class AutoState(JacobiState):
    counts: Optional[torch.Tensor] = None  # the last step's counts (`HostCounts`) on the device


class AutoDrafter(JacobiDrafter, AdaptiveDrafter):
    state_class = AutoState
    clock = staticmethod(time.perf_counter)  # the step clock (a test may replace it)

    def __init__(self, params, model, sampling):
        # more candidates than codes is every code: the default width on a model with fewer codes (a test's tiny one)
        params = dataclasses.replace(params, tree_width=min(params.tree_width, model.geometry.vocab_size))
        super().__init__(params, model, sampling)
        self.params, self.sampling = params, sampling  # the memory's key (`start`)
        self.cost = CostModel(params.cost_model, self.shapes)
        self.policy = WindowPolicy(self.shapes, self.cost, (w for w in self.shapes if self.K > 1 and w >= self.D))
        self.trials = InitTrials(candidate_inits(params.init) if params.adapt_init else (params.init,))
        self.order_t = torch.tensor(self.policy.order, dtype=torch.long, device=model.device)

    def cost_shapes(self) -> dict:
        """Each window's chain and, where it may carry them, its chain with the branches (("tree", window)): timed
        by the engine once per model / device / batch."""
        if not self.cost.measured:
            return {}
        return {**{w: shape[1] for w, shape in self.shapes.items()},
                **{("tree", w): self.shapes[w][2] for w in sorted(self.policy.tree_windows)}}

    def set_costs(self, seconds: dict) -> None:
        self.cost.set_costs(seconds)

    def one_off(self, plan) -> bool:
        """A probe of a smaller window (or AR) is one step: compiled, it runs eager (compiled_step.StepGraphs)."""
        return self.policy.probing

    def fell_back_to_ar(self) -> Optional[str]:
        return self.policy.fell_back_to_ar()

    def _new_state(self, state: LoopState, first) -> AutoState:
        ds = super()._new_state(state, first)
        ds.counts = torch.zeros(2 + len(self.policy.order) + 2, dtype=torch.long, device=state.ctx.device)
        return ds

    def start(self, state: LoopState, first, p0):
        self.reset_policy()
        # the memory (`AutoMemory`), measured costs in the same-image-as-AR mode only: with it off a seed gives the
        # same image again (docs/REPRODUCIBLE.md). Its key without the calibration, set by the engine after `start`
        if self.cost.measured and state.ctx.reproducible:
            setting = dataclasses.astuple(self.sampling), dataclasses.astuple(self.params), state.ctx.batch, True
            self.memory_at = weakref.ref(state.ctx.model), setting + (torch.get_num_threads(),)
        self.row_codes = state.ctx.layout.geometry.row_stride
        return super().start(state, first, p0)

    def reset_policy(self) -> None:
        """The policy objects new for a generation (the memory binds at its first step: `_bind_memory`)."""
        self.cost.reset()
        self.policy.reset()
        self.trials.reset()
        self.window = self.reach = self.policy.choice  # the largest: drafted by the configured init in `start`
        self.memory_at = None  # (the model, the setting) of the memory (`start`; a policy run alone has none)
        self.last = None  # the previous step (`Step`)
        self.done = 1.0  # tokens per row committed before this step (the prefill's first)
        self.row_codes = 0  # positions of the image's first row (`start`; 0: a policy run without a generation)

    def _bind_memory(self) -> None:
        model = self.memory_at[0]() if self.memory_at is not None else None
        if model is not None:
            setting = self.memory_at[1] + (tuple(sorted(self.cost.forward.items())),)
            self.policy.bind(AutoMemory.recall(model, setting, self.shapes))

    def host_hint(self, state: LoopState):
        """The last step's counts, then the rows that want the proactive branches now (`HostCounts`)."""
        ds = state.draft
        if not self.policy.tree_windows:
            return ds.counts
        return torch.cat([ds.counts, (ds.in_tree & state.active).sum().reshape(1)])

    def plan(self, state: LoopState, hint: list) -> JacobiPlan:
        """The last step's counts and wall time into the policy objects, then this step's plan."""
        now = self.clock() if self.cost.measured else 0.0
        counts = HostCounts.read(hint, len(self.policy.order))
        if self.last is None:
            self._bind_memory()
        elif counts.rows:
            self._learn(state.step, counts, now)
        window = self.policy.choice = self.choose(state)
        window = self.policy.step_window(state.step, window)
        init = self.choose_init(state, window)
        init = init if window else None  # an AR step drafts nothing (one graph, whatever the init)
        # a window larger than the last step's reaches undrafted positions (`observe` drafts up to the new frontier
        # + its own window); compiled, every drafting step grows (an empty mask when it did not): one graph per window
        last = self.last.window if self.last is not None else self.window
        grow = window > last or (state.ctx.compiled and window > 0)
        # built for the next step only where they pay at this window (the next step most often runs it)
        branches = self.policy.tree_pays(window)
        tree = counts.want_tree > 0 and branches
        fresh = window > self.reach
        scored = bool(window) and self.last is not None and self.last.init == init
        self.reach = max(window, self.window)  # the largest window of the last two steps: what is drafted ahead
        self.window = window
        self.policy.used[window] += 1
        self.policy.tree_steps += tree
        if init is not None:
            self.trials.used[init] += 1
        self.last = Step(window, now, fresh, init, scored, tree)
        return JacobiPlan(window, tree=tree, grow=grow, init=init, branches=branches)

    def _learn(self, step: int, counts: HostCounts, now: float) -> None:
        """The previous step's counts and wall time. Not counted in tokens per step: the first WARMUP_STEPS steps, a
        step that verified fresh drafts, and steps in the image's first row (no row above: sample_above's source)."""
        last = self.last
        if counts.tree_rows:  # every tree step counts: the gain is the branches', not the window's
            self.policy.tree_rows += counts.tree_rows
            self.policy.tree_added += counts.tree_added
        first_row = self.done < self.row_codes
        self.done += (counts.tokens + counts.tree_added) / counts.rows
        if step > WARMUP_STEPS and not last.fresh and not first_row:
            per_row = counts.tokens / counts.rows
            self.policy.count_step(last.window, per_row, [c / counts.rows for c in counts.credits])
            if last.scored:
                self.trials.score(last.init, last.window, per_row)
        if self.cost.measured:
            self.cost.measure(last.window, now - last.started, step - 1, last.tree)

    def choose(self, state: LoopState) -> int:
        """The step's window from earlier steps' counts and costs only, never `state`'s drafts: a choice that
        depended on them would bias which drafts get verified (tests/test_auto.py plants one)."""
        return self.policy.choose()

    def choose_init(self, state: LoopState, window: int) -> str:
        return self.trials.choose(state.step, window, self.policy.tokens[window], self.policy.counted[window])

    def observe(self, state: LoopState, plan, tree, verdict, p_all, out, previous_frontier):
        active = state.active
        carried = state.draft.in_tree & active  # the rows this step verified with the branches (when plan.tree)
        ds = super().observe(state, plan, tree, verdict, p_all, out, previous_frontier)
        n = torch.where(active, verdict.n_accepted + 1, 0)
        if plan.tree:  # a branch won depth 1 where the line's first slot is a branch slot (past the chain's T)
            won = (verdict.path[:, 1] >= self.shapes[plan.window][0]) & carried
            chain_n = torch.where(won, 1, n)  # the windows' counts are the chain's: one token where a branch won
            branch = torch.stack([carried.sum(), (n - chain_n).sum()])
        else:
            chain_n, branch = n, torch.zeros(2, dtype=torch.long, device=state.ctx.device)
        credits = torch.minimum(chain_n[None, :], self.order_t[:, None] + 1).sum(1)  # [windows]: min(n, W + 1)
        ds.counts = torch.cat([torch.stack([chain_n.sum(), active.sum()]), credits, branch])
        return ds

    def report(self) -> dict:
        """What auto chose and why: steps per window and per init, each window's cost and expected tokens per
        step at the end of the generation, the probes, the init trials, and whether it fell back to AR."""
        pol, cost, trials, measured = self.policy, self.cost, self.trials, self.cost.measured
        main = max(pol.used, key=lambda w: (pol.used[w], w))
        init_main = max(trials.used, key=lambda i: (trials.used[i], i == trials.inits[0]))
        drafting = sum(trials.used.values())
        chose = f"window {main} for {pol.used[main]} of {sum(pol.used.values())} steps" + (
            f", init {init_main} for {trials.used[init_main]} of {drafting} drafting steps" if drafting else "")
        return {
            "cost_model": cost.kind,
            "chose": chose,
            "fell_back_to_ar": self.fell_back_to_ar(),
            "steps_per_window": {str(w): n for w, n in sorted(pol.used.items()) if n},
            "probe_steps": {str(w): n for w, n in sorted(pol.probed.items()) if n},
            "tokens_per_step": {str(w): round(pol.tokens[w] / n, 2) for w, n in sorted(pol.counted.items()) if n},
            "steps_per_init": {i: n for i, n in trials.used.items() if n},
            # steps that carried the proactive branches, and the tokens per row they were estimated to add
            "tree_steps": pol.tree_steps,
            "tree_gain": round(pol.tree_gain(), 3) if pol.tree_windows else None,
            "init_trials": [dict(zip(("init", "tokens_per_step", "preferred_tokens_per_step", "window", "won"), t))
                            for t in trials.trials],
            "init_preferred": trials.preferred,
            "load": round(cost.load(), 3) if measured else None,  # step time / calibrated forward time, now
            "step_cost_ms": {str(w): round(1e3 * cost.cost(w), 3) for w in sorted(self.shapes)} if measured else None,
            "rel_cost": {str(w): round(cost.rel(w), 3) for w in sorted(self.shapes) if cost.samples[w]}
            if measured else None,
            "expected_tokens_per_step": {str(w): round(n, 2) for w, n in sorted(pol.expected_tokens().items())},
            # earlier generations on this model at these settings whose measurements were this one's prior
            "earlier_generations": pol.memory.generations - 1 if pol.memory is not None else 0,
            "rule": "each step: the window maximising expected tokens per step / step cost (re-measured each step, "
                    "low medians; a probe of the runner-up every %d steps) and the init whose drafts commit more "
                    "(a trial block of the other when drafts commit under %.0f%% of the window), from earlier "
                    "steps only" % (PROBE_EVERY, 100 * TRIAL_BELOW),
        }
