"""auto's window policy: each step's window, the one of the best predicted rate E[tokens | W] / cost(W), kept
unless another is predicted SWITCH_MARGIN better (a switch verifies fresh drafts), or a probe; whether the proactive
branches pay; and the memory across generations (`AutoMemory`). E[tokens | W]: the mean tokens per row of W's counted
steps, shrunk towards a prior by PRIOR_STEPS pseudo-steps; a step of a larger window V also counts for each smaller
W with min(n, W + 1) tokens per row (its first W drafts are what a W-window step would have verified)."""
from __future__ import annotations

import math
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Optional

from .cost import RECENT, REL_PRIOR, CostModel

PRIOR_STEPS = 8.0  # weight of the prior, in steps
SWITCH_MARGIN = 1.1
# a smaller drafting window must be predicted this much better: its estimate rests mostly on credits from the larger
# window's steps, whose first drafts were refined more often than a smaller window's own (credits overrate it)
SWITCH_DOWN_MARGIN = 1.25
WARMUP_STEPS = 4  # steps not counted in tokens per step (nor those that start in the image's first row)
EXPLORE_STEPS = 3  # steps of an upward probe block (its first verifies fresh drafts: not counted)
PROBE_AGREES = 1.25  # a probe's cost sample within this factor of the window's rel: the next probe of it 4x later
AR_AGREES = 2.0  # a first AR probe within this factor of its prior rel (1) confirms the calibration: no second one
PROBE_EVERY = 8  # steps between probes of the runner-up window (measured cost model)
FALLBACK_SHARE = 0.5  # auto "fell back to AR" when more than this share of its steps were AR steps
# tokens per row the proactive branches add on a step that carries them, before any such step is measured
# (SJD-PAC over SCD at the same window, measured on the demo model); shrunk like the windows' estimates
TREE_GAIN_PRIOR = 0.25
MEMORY_STEPS = 64  # counted steps per window a memory keeps (older ones fade: halved past it)
# model -> {setting: AutoMemory} while the model lives, never written into it (like the engine's calibrated costs)
_MEMORY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def prior_tokens_per_step(window: int) -> float:
    """The prior of tokens committed per step with a window: 1 + 7 (1 - exp(-W / 24)), a fit of
    SCD's measured curve on the demo model;
    each generation corrects it."""
    return 1.0 + 7.0 * (1.0 - math.exp(-window / 24.0))


def shrunk(prior: float, tokens: float, counted: float) -> float:
    """Tokens per step: the mean of `counted` steps that committed `tokens` in all, shrunk towards `prior` by
    PRIOR_STEPS pseudo-steps."""
    return (PRIOR_STEPS * prior + tokens) / (PRIOR_STEPS + counted)


def candidate_windows(max_window: int) -> tuple:
    """0 (plain AR), then powers of two up to `max_window` (and `max_window` itself), largest first."""
    ws = {0, max_window} | {w for w in (2, 4, 8, 16, 32, 64, 128) if w < max_window}
    return tuple(sorted(ws, reverse=True))


@dataclass
class AutoMemory:
    """What auto measured with the measured cost model (same image as AR) on one model at one setting: per window,
    the tokens of its counted steps (summed, at most MEMORY_STEPS steps' worth), its rel samples and its probes. A
    new generation takes them as its prior (`WindowPolicy.bind`) instead of the demo-fitted formula and a rel of 1,
    so the learning a generation pays (probes, steps of windows that turn out slower) is not paid at every image.
    Lossless: like every choice of auto, a function of what happened before the step."""

    tokens: dict
    counted: dict
    samples: dict  # window -> deque of rel samples: the running generation's own (`CostModel.samples`)
    probes: dict
    generations: int = 0

    @classmethod
    def recall(cls, model, setting: tuple, windows) -> "AutoMemory":
        """The model's memory at `setting` (a new one the first time), counting the generation that takes it."""
        new = cls({w: 0.0 for w in windows}, {w: 0 for w in windows}, {w: deque(maxlen=RECENT) for w in windows},
                  {w: 0 for w in windows})
        memory = _MEMORY.setdefault(model, {}).setdefault(setting, new)
        memory.generations += 1
        return memory

    def count(self, window: int, tokens: float) -> None:
        self.tokens[window] += tokens
        self.counted[window] += 1
        if self.counted[window] > MEMORY_STEPS:  # fade: the model's acceptance at these settings may drift
            self.tokens[window] /= 2
            self.counted[window] /= 2

    def prior(self, window: int) -> float:
        """Tokens per step: the earlier generations' mean shrunk towards `prior_tokens_per_step` by PRIOR_STEPS."""
        return shrunk(prior_tokens_per_step(window), self.tokens[window], self.counted[window])


class WindowPolicy:
    def __init__(self, windows, cost: CostModel, tree_windows=frozenset()):
        self.windows, self.cost = tuple(windows), cost  # largest first
        self.order = tuple(sorted(self.windows))  # ascending: the credits' order
        self.tree_windows = frozenset(tree_windows)  # the windows that may carry the proactive branches
        self.reset()

    def reset(self) -> None:
        """A new generation, from the formula's prior (`bind`: from a memory's)."""
        # the window `choose` last chose: the incumbent of its switch margins (a probe runs another for a step)
        self.choice = self.windows[0]
        self.memory = None
        self.prior = {w: prior_tokens_per_step(w) for w in self.windows}
        self.tokens = {w: 0.0 for w in self.windows}  # window -> tokens per step, summed over its counted steps
        self.counted = {w: 0 for w in self.windows}
        self.used = {w: 0 for w in self.windows}  # steps per window
        self.probes = {w: 0 for w in self.windows}  # probes per window (a memory's: all its generations)
        self.probed = {w: 0 for w in self.windows}  # probes per window in this generation
        self.explore_window, self.explore_left = 0, 0  # an upward probe block: its window, its steps still to run
        self.probing = False  # this step is a single probe step
        self.tree_rows, self.tree_added, self.tree_steps = 0, 0.0, 0  # rows that carried the branches, their tokens

    def bind(self, memory) -> None:
        """Earlier generations' measurements as the prior; their rel samples and probe counts this one's own."""
        self.memory, self.probes = memory, memory.probes
        self.cost.samples = memory.samples
        self.cost.forget()
        self.prior = {w: memory.prior(w) for w in self.windows}

    def count(self, window: int, tokens: float) -> None:
        self.tokens[window] += tokens
        self.counted[window] += 1
        if self.memory is not None:
            self.memory.count(window, tokens)

    def count_step(self, window: int, tokens: float, credits) -> None:
        """A counted step: `tokens` per row, and each candidate's credit per row (ascending windows)."""
        self.count(window, tokens)
        for smaller, credit in zip(self.order, credits):
            if smaller < window:
                self.count(smaller, credit)

    def expected_tokens(self) -> dict:
        """Each window's tokens per step: its mean shrunk towards its prior (earlier generations' or the
        formula's, but at least the next smaller window's estimate grown as the formula grows: credits never
        measure a window larger than auto runs), and at least the smaller window's estimate."""
        est, smaller = {}, None
        for w in self.order:  # ascending
            prior = self.prior[w]
            if smaller is not None:
                prior = max(prior, est[smaller] * prior_tokens_per_step(w) / prior_tokens_per_step(smaller))
            e = shrunk(prior, self.tokens[w], self.counted[w])
            est[w] = max(e, est[smaller]) if smaller is not None else e
            smaller = w
        return est

    def rates(self) -> dict:
        tokens = self.expected_tokens()
        return {w: tokens[w] / self.cost.cost(w) for w in self.windows}

    def tree_gain(self) -> float:
        """Tokens per row the branches add on a step that carries them (where a branch won depth 1: its accepted
        depth beyond the chain's one token), shrunk towards TREE_GAIN_PRIOR by PRIOR_STEPS pseudo-rows."""
        return shrunk(TREE_GAIN_PRIOR, self.tree_added, self.tree_rows)

    def tree_pays(self, window: int) -> bool:
        """The branches pay at this window: rate with them > rate without (forwards: whenever they add any)."""
        if window not in self.tree_windows:
            return False
        tokens = self.expected_tokens()[window]
        return (tokens + self.tree_gain()) / self.cost.cost(window, True) > tokens / self.cost.cost(window)

    def choose(self) -> int:
        """The window of the best predicted rate, unless the incumbent is within the switch margin."""
        rate = self.rates()
        best = max(self.windows, key=lambda w: (rate[w], w))
        margin = SWITCH_DOWN_MARGIN if 0 < best < self.choice else SWITCH_MARGIN
        return best if rate[best] > margin * rate[self.choice] else self.choice

    def step_window(self, step: int, window: int) -> int:
        """The window this step runs: the chosen one, or a probe (an upward block of EXPLORE_STEPS steps, whose
        tokens only steps after its first measure; else one step: `probing`)."""
        self.probing = False
        if self.explore_left:
            self.explore_left -= 1
            return self.explore_window
        probe = self.probe(step, window)
        if probe is None:
            return window
        if probe > window:
            self.explore_window, self.explore_left = probe, EXPLORE_STEPS - 1
        self.probing = probe < window
        self.probes[probe] += 1
        self.probed[probe] += 1
        return probe

    def probe(self, step: int, window: int) -> Optional[int]:
        """Every PROBE_EVERY steps after the warm-up (measured costs only), the window to probe, or None:
        - plain AR while probes gave it under REL_PRIOR rel samples (its tokens per step are known, its cost is
          not: an AR step drafts nothing), unless its first sample agreed with the calibration within AR_AGREES;
        - else the next larger window while it has under PRIOR_STEPS counted steps (this generation's and the
          memory's) and could pay at all ((W + 1) tokens per its cost beat the current rate): credits never
          measure a larger window than auto runs;
        - else the runner-up by rate, when not measured in the last PROBE_EVERY x min(1 + its probes beyond
          REL_PRIOR, 4) steps (x 4 at once when its last sample agreed with its rel within PROBE_AGREES)."""
        s = step - WARMUP_STEPS
        if not self.cost.measured or s <= 0 or s % PROBE_EVERY or len(self.windows) < 2:
            return None
        rate = self.rates()
        runner_up = max((w for w in self.windows if w != window), key=lambda w: (rate[w], w))
        ar = self.cost.samples[0] if 0 in self.windows else ()
        if window and 0 in self.windows and len(ar) < REL_PRIOR and not (ar and 1 / AR_AGREES < ar[-1] < AR_AGREES):
            runner_up = 0
        counted = self.memory.counted if self.memory is not None else self.counted
        larger = [w for w in self.order if w > window]
        if runner_up != 0 and larger and counted[larger[0]] < PRIOR_STEPS and \
                (larger[0] + 1) / self.cost.cost(larger[0]) > rate[window]:
            return larger[0]
        samples = self.cost.samples[runner_up]
        agreed = bool(samples) and 1 / PROBE_AGREES < samples[-1] / self.cost.rel(runner_up) < PROBE_AGREES
        stale = PROBE_EVERY * (4 if agreed else min(1 + max(self.probes[runner_up] - REL_PRIOR, 0), 4))
        return runner_up if step - self.cost.measured_at[runner_up] >= stale else None

    def fell_back_to_ar(self) -> Optional[str]:
        """One line when most steps were plain AR steps (None otherwise): how many, and why."""
        total = sum(self.used.values())
        if 0 not in self.windows or not total or self.used[0] <= FALLBACK_SHARE * total:
            return None
        rate, cost = self.rates(), self.cost.cost
        best = max((w for w in self.windows if w), key=lambda w: (rate[w], w))
        return (f"auto fell back to plain AR for {self.used[0]} of {total} steps: its best drafting window, "
                f"{best}, was estimated at {self.expected_tokens()[best]:.1f} tokens per step for "
                f"{cost(best) / cost(0):.1f}x an AR step's cost, {rate[best] / rate[0]:.2f}x AR's tokens "
                f"per second")
