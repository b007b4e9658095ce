"""`auto`: the Jacobi family with its window and its draft initialisation chosen every step from the
acceptance seen so far and the step cost measured during the generation.

The drafter is SCD with maximal coupling (adaptive continuation): drafts are the previous step's
MRS outputs, verified by `verify_chain`. What `auto` adds is, every step, on the host (`plan`):

- the window W_t among a few fixed shapes (AR's single slot, and windows up to `max_window`),
  maximising the predicted tokens committed per second, rate(W) = E[tokens | W] / cost(W);
- the `init` rule of the positions the step drafts afresh: the configured one or one alternative
  (`random`, or `sample_above` when `random` is configured), tried in short blocks and kept when
  its drafts commit more;
- SJD-PAC's proactive branches (`tree_width` K, `tree_depth` D): after a rejection the next step may
  carry K-1 branches of depth D under the pending token (JacobiDrafter's tree step); auto carries them
  when (E[tokens | W] + gain) / cost(W with them) > E[tokens | W] / cost(W), where `gain` is the tokens
  per row they added on the steps that carried them (the accepted depth of a row whose branch won
  depth 1: the chain alone commits one token there), shrunk towards TREE_GAIN_PRIOR; with the forwards
  cost model whenever the gain is positive. The windows' counts are the chain's (a row whose branch won
  counts one token), so E[tokens | W] does not already hold the gain.

E[tokens | W]: the mean tokens committed per step over this generation's steady steps with window
W (not the first `WARMUP_STEPS` steps, nor a step whose window reached positions no earlier step
had drafted: both verify fresh `init` drafts), shrunk towards `prior_tokens_per_step(W)` by
`PRIOR_STEPS` pseudo-steps. A step run with a larger window V also counts, for every smaller
candidate W, as a step that committed min(n, W + 1) tokens per row (n: what it committed): the
first W drafts of V's chain are the drafts a W-window step would have verified.

cost(W) = calibrated(W) x rel(W) x load, all three measured, none taken once:
- calibrated(W): the engine's timing of the model forward at W's shape before the first step
  (`cost_shapes`, once per model / batch / guidance / compile / threads: engine.py), the prior;
- rel(W): how far W's steps in this generation ran from that prior, against the steps of other
  windows just before them (so under the same load): the low median of W's last `RECENT` samples
  of (step time / calibrated(W)) / (the same of the other windows among the last `LOAD_STEPS`
  steps, each over its rel) and `REL_PRIOR` pseudo-samples of 1 (one odd sample cannot move it). So a calibration that one busy moment distorted
  is corrected by the steps themselves;
- load: the low median of the last `LOAD_STEPS` steps' step time / calibrated(W) / rel(W): what
  the machine's load does to every window now. A load spike in one step moves neither median.
- every `PROBE_EVERY` steps the runner-up window, when its cost was not measured in the last
  `PROBE_EVERY` steps, runs one step (a probe): costs of windows auto is not running are
  re-measured, so a choice made from a stale or distorted cost (plain AR above all: an AR step
  tells nothing about a drafting window's cost) is revisited. A probe is a window like any other;
  until probes measured plain AR (2 rel samples), the probe is an AR step.
- memory (`AutoMemory`): the tokens per step and rel samples measured in earlier generations on the
  same model and settings are the prior of the next.
With ``cost_model="forwards"`` every step costs the same (fewest forwards, the GPU regime; no
clock read, deterministic). The current window is kept unless another is predicted
`SWITCH_MARGIN` better (a switch costs: the drafts a larger window reaches are fresh).

The init: when the window's steps commit under `TRIAL_BELOW` of what it could (drafts are poor:
room to gain), `INIT_TRIAL_STEPS` steps draft with the init not preferred now (a trial block),
first `INIT_TRIAL_AFTER` steps after the warm-up, then every `INIT_TRIAL_EVERY` steps (less often
after each lost trial). Every drafting step whose previous step drafted with the same init scores
that init (the first of a block verifies drafts the other init made). After each block the trial's
low-median tokens per step (a stuck window commits 1, 1, 1, 9, 1: a mean follows the outlier) is compared with the preferred init's last `INIT_COMPARED` scored steps at
the same window (like for like, close in time); the trial init becomes the preferred one when it
committed `INIT_MARGIN` more. Off by default, because there is nothing for it to find and its
trials cost (issue 36, step compression, forwards cost model at max_window 64 unless said):
- no init beats `sample_above` in any bench regime: over 72 `paper` images random init commits 0.96x
  its tokens per forward (1.12x, 0.99x, 0.90x on the seed sets 0-1, 2-9, 10-17: 8 images are no
  evidence at this noise), on `flat` 0.96-0.99x, on `demo` 0.65x;
- the trials run on the demo model too (its windows commit under half their size on most images:
  6.7-11 tokens per step at 16, 4.3-14.6 at 64), and their scores are noise: a trial has at most 3
  scored steps, and those verify drafts made W / (tokens per step) steps earlier, mostly by the other
  init (a fresh draft enters at the window's far end). adapt_init there: 0.81x at the defaults (16
  images), 0.91x at max_window 64 (40 images).

Why it stays lossless: the window and the init of step t are functions of what happened before
step t (the counts, the clock), never of step t's drafts or random draws. Conditioned on that
history each draft in the window is still distributed as the q recorded for it (whichever init
drew it), so every MRS check is exact (docs/ARCHITECTURE.md). Drafts beyond a shrunken window keep
their tokens and q until a later window reaches them; a window that grows drafts the new positions
by the step's init first.
"""
from __future__ import annotations

import dataclasses
import math
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from statistics import median_low
from typing import ClassVar, Optional

import torch

from .base import LoopState
from .jacobi import INIT_ABOVE_PAPER, INIT_HELP, JacobiDrafter, JacobiParams, JacobiPlan, JacobiState, restart_param
from .params import INITS, MAX_TREE_WIDTH, MAX_WINDOW, Method, StepCost, chain_tokens, param

PRIOR_STEPS = 8.0  # weight of the prior, in steps
SWITCH_MARGIN = 1.1
# a smaller drafting window must be predicted this much better: its estimate rests mostly on credits from the larger
# window's steps, whose first drafts were refined more often than a smaller window's own (credits overrate it)
SWITCH_DOWN_MARGIN = 1.25
WARMUP_STEPS = 4  # steps not counted in tokens per step (nor those that start in the image's first row)
EXPLORE_STEPS = 3  # steps of an upward probe block (its first verifies fresh drafts: not counted)
RECENT = 8  # step-time samples kept per window (rel)
REL_PRIOR = 2  # pseudo-samples of rel = 1 (the calibration) in rel's median
LOAD_STEPS = 5  # steps in the load estimate
PROBE_AGREES = 1.25  # a probe's cost sample within this factor of the window's rel: the next probe of it 4x later
AR_AGREES = 2.0  # a first AR probe within this factor of its prior rel (1) confirms the calibration: no second one
PROBE_EVERY = 8  # steps between probes of the runner-up window (measured cost model)
INIT_TRIAL_AFTER = 4  # steps after the warm-up before the first trial block of the other init
INIT_TRIAL_EVERY = 32  # steps between trial blocks (times 1 + the trials the other init lost, at most 4x)
INIT_TRIAL_STEPS = 4  # steps of a trial block (the first verifies the preferred init's drafts: not scored)
INIT_TRIAL_SEEN = 2  # counted steps of the current window before a trial (its tokens per step tell the room)
TRIAL_BELOW = 0.5  # a trial only when the window's steps commit under this share of window + 1 tokens
INIT_COMPARED = 6  # scored steps of each init kept for the comparison after a trial block
INIT_MARGIN = 1.15
FALLBACK_SHARE = 0.5  # auto "fell back to AR" when more than this share of its steps were AR steps
MEMORY_STEPS = 64  # counted steps per window a model's memory keeps (`AutoMemory`; older ones fade: halved past it)
# tokens per row the proactive tree adds on a step that carries it, before any such step is measured: SJD-PAC over
# SCD at the same window committed 1.05x (demo) to 1.08x (paper regime) per forward (docs/BENCHMARKS.md), about a
# quarter of a token at their tokens per step; shrunk like the windows' estimates by PRIOR_STEPS pseudo-steps
TREE_GAIN_PRIOR = 0.25

# what auto measured on each model in earlier generations, per setting (`AutoMemory`): kept while the model lives,
# never written into the model (engine-side state, like the engine's calibrated forward costs)
_MEMORY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def prior_tokens_per_step(window: int) -> float:
    """The prior of tokens committed per step with a window: 1 + 7 (1 - exp(-W / 24)), a fit of
    SCD's measured curve on the demo model (docs/BENCHMARKS.md); each generation corrects it."""
    return 1.0 + 7.0 * (1.0 - math.exp(-window / 24.0))


def shrunk(prior: float, tokens: float, counted: float) -> float:
    """Tokens per step: the mean of `counted` steps that committed `tokens` in all, shrunk towards `prior` by
    PRIOR_STEPS pseudo-steps."""
    return (PRIOR_STEPS * prior + tokens) / (PRIOR_STEPS + counted)


def candidate_windows(max_window: int) -> tuple:
    """0 (plain AR), then powers of two up to `max_window` (and `max_window` itself), largest first."""
    ws = {0, max_window} | {w for w in (2, 4, 8, 16, 32, 64, 128) if w < max_window}
    return tuple(sorted(ws, reverse=True))


def candidate_inits(init: str) -> tuple:
    """The configured init, then the one auto tries beside it: random (the papers'; it wins on flat targets,
    issue 36), or sample_above when random is configured."""
    return (init, "sample_above" if init == "random" else "random")


@dataclass
class AutoMemory:
    """What auto measured with the measured cost model (same image as AR) on one model at one setting (sampling,
    parameters, batch, verification mode, threads, calibration), carried from each generation to the next: per
    window, the tokens of its counted steps (summed, at most MEMORY_STEPS steps' worth: older ones fade) and its
    rel samples (step cost against the other windows'), and how often it was probed. A new generation takes them
    as its prior (instead of the demo-fitted curve `prior_tokens_per_step` and a rel of 1): the learning a
    generation pays (probes, steps of windows that turn out slower) is not paid again at every image from the
    demo-fitted prior. Lossless: like every choice of auto, a function of what happened before the step."""

    tokens: dict
    counted: dict
    samples: dict  # window -> deque of rel samples: the running generation's own (`AutoDrafter.samples`)
    probes: dict
    generations: int = 0

    @classmethod
    def empty(cls, windows) -> "AutoMemory":
        return cls({w: 0.0 for w in windows}, {w: 0 for w in windows}, {w: deque(maxlen=RECENT) for w in windows},
                   {w: 0 for w in windows})

    def count(self, window: int, tokens: float) -> None:
        self.tokens[window] += tokens
        self.counted[window] += 1
        if self.counted[window] > MEMORY_STEPS:  # fade: the model's acceptance at these settings may drift
            self.tokens[window] /= 2
            self.counted[window] /= 2

    def prior(self, window: int) -> float:
        """Tokens per step: the earlier generations' mean shrunk towards `prior_tokens_per_step` by PRIOR_STEPS."""
        return shrunk(prior_tokens_per_step(window), self.tokens[window], self.counted[window])


@dataclass(frozen=True)
class AutoParams(JacobiParams):
    max_window: int = param(16, "the largest window auto may choose (it picks among AR's single slot and windows up "
                            "to this); 16, the other backends' window: on a CPU a larger one rarely pays; on a "
                            "GPU, where a wider forward costs little, try 64",
                            lo=1, hi=MAX_WINDOW, sizes=True, essential=True)
    cost_model: str = param("measured", "measured: maximise tokens per second on this device (each window's step "
                            "time measured during the generation, robust to a load spike; with same_image_as_ar "
                            "off the image follows those timings); forwards: minimise forward passes "
                            "(deterministic; what a GPU wants)", choices=("measured", "forwards"))
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_PAPER)
    adapt_init: bool = param(False, "also choose the init online: try random (sample_above when init is random) in "
                             "short blocks when drafts commit under half the window, keep it where it commits more; "
                             "off by default: no init beat sample_above in any bench regime, and on the demo model its trials "
                             "cost forwards (0.81x step compression at the defaults; docs/ARCHITECTURE.md)")
    restart_after: int = restart_param(16)
    tree_width: int = param(4, "proactive drafting (SJD-PAC's): after a rejection, K candidates at the first open "
                            "position, each with a branch of tree_depth drafts; auto carries them on a step when "
                            "their measured gain in tokens beats their cost (always with cost_model forwards); "
                            "1: off", lo=1, hi=MAX_TREE_WIDTH, paper="SJD-PAC paper: K = 4", sizes=True)
    tree_depth: int = param(2, "proactive drafting: depth D of each branch (windows smaller than D carry none)",
                            lo=1, hi=MAX_WINDOW, paper="SJD-PAC paper: D = 3", sizes=True)
    redraft: ClassVar[str] = "maximal"  # SCD / adaptive continuation
    coupling_strength: ClassVar[float] = 1.0

    @property
    def windows(self) -> tuple:
        return candidate_windows(self.max_window)

    def check(self) -> None:
        if self.tree_width > 1 and self.tree_depth > self.max_window:
            raise ValueError(f"tree_depth must be an int in [1, {self.max_window}], got {self.tree_depth} (a branch "
                             f"cannot be deeper than the largest window, max_window={self.max_window}; tree_width=1 "
                             f"turns the branches off)")


@dataclass
class AutoState(JacobiState):
    """The Jacobi state and the last step's counts (the host hint auto's policy reads)."""

    # the last step's [tokens, rows, each candidate window's credit, rows that carried the proactive tree, the
    # tokens its branches added (the accepted depth of rows whose branch won depth 1: the chain alone commits 1)]
    committed: Optional[torch.Tensor] = None


class AutoDrafter(JacobiDrafter):
    state_class = AutoState
    clock = staticmethod(time.perf_counter)  # the step clock (a test may replace it)

    def __init__(self, params: AutoParams, model, sampling):
        # more candidates than codes is every code: the default width on a model with fewer codes (a test's tiny one)
        params = dataclasses.replace(params, tree_width=min(params.tree_width, model.geometry.vocab_size))
        super().__init__(params, model, sampling)
        self.params, self.sampling = params, sampling  # the memory's key (`start`)
        self.cost_model = params.cost_model
        self.inits = candidate_inits(params.init) if params.adapt_init else (params.init,)
        self.forward_cost = {}  # window -> calibrated seconds of a forward of its chain (set_costs)
        self.tree_cost = {}  # window -> the same with the proactive branches
        self.order = tuple(sorted(self.shapes))  # the candidate windows, ascending: the credits' order
        self.order_t = torch.tensor(self.order, dtype=torch.long, device=model.device)
        # the windows that may carry the proactive branches (at least D deep: a branch is no deeper than the window)
        self.tree_windows = frozenset(w for w in self.shapes if self.K > 1 and w >= self.D)

    # -- costs ---------------------------------------------------------------------------------
    def cost_shapes(self) -> dict:
        """The chain of each window and, where it may carry them, the chain with the proactive branches
        (keyed ("tree", window)): what the engine times once per model / device / batch."""
        if self.cost_model != "measured":
            return {}
        return {**{w: shape[1] for w, shape in self.shapes.items()},
                **{("tree", w): self.shapes[w][2] for w in sorted(self.tree_windows)}}

    def set_costs(self, seconds: dict) -> None:
        self.forward_cost = {k: v for k, v in seconds.items() if not isinstance(k, tuple)}
        self.tree_cost = {k[1]: v for k, v in seconds.items() if isinstance(k, tuple)}

    def calibrated(self, window: int, tree: bool = False) -> float:
        """The engine's calibrated forward seconds of a window's step shape (1 when not calibrated)."""
        return (self.tree_cost if tree else self.forward_cost).get(window, 1.0)

    def rel(self, window: int) -> float:
        """Window's measured step cost over its calibrated forward, relative to the load (1: not run yet)."""
        if window not in self._rel:  # memo until the next measurement (`_measure`): a plan asks for it dozens of times
            samples = self.samples[window]
            # REL_PRIOR pseudo-samples of 1 (the calibration): one odd sample cannot move it, two that agree can
            self._rel[window] = median_low(list(samples) + [1.0] * REL_PRIOR) if samples else 1.0
        return self._rel[window]

    def load(self) -> float:
        """Step time over calibrated forward time of the last LOAD_STEPS steps (each over its window's rel), low median."""
        if self._load is None:  # memo until the next measurement, like rel
            self._load = median_low([ratio / self.rel(w) for w, ratio in self.recent]) if self.recent else 1.0
        return self._load

    def cost(self, window: int, tree: bool = False) -> float:
        """Seconds per step now: calibrated forward x rel(window) x load (module docstring); with the proactive
        branches, their calibrated forward instead (the same rel and load: the step is the window's)."""
        if self.cost_model == "forwards":
            return 1.0
        return self.calibrated(window, tree) * self.rel(window) * self.load()

    def _measure(self, window: int, seconds: float, step: int, tree: bool = False) -> None:
        """One step's wall time into the load and, when the last steps ran other windows, into rel(window):
        its time against theirs, close in time (so under the same load). The window auto keeps running
        gets no rel sample from its own steps: the load absorbs what they say, and rel compares windows.
        A step with the proactive branches is measured against their calibrated forward."""
        ratio = seconds / self.calibrated(window, tree)
        others = [r / self.rel(w) for w, r in self.recent if w != window]
        if others:
            self.samples[window].append(ratio / median_low(others))
        self.recent.append((window, ratio))
        self.measured_at[window] = step
        self._rel, self._load = {}, None

    # -- the choice ----------------------------------------------------------------------------
    def _new_state(self, state: LoopState, first) -> "AutoState":
        ds = super()._new_state(state, first)
        ds.committed = torch.zeros(2 + len(self.order) + 2, dtype=torch.long, device=state.device)
        return ds

    def start(self, state: LoopState, first, p0):
        self.reset_policy()
        # the memory's key (`AutoMemory`) without the calibration, which the engine sets after `start`
        self.same_image = state.reproducible  # memory only then (`_bind_memory`)
        self.settings = (dataclasses.astuple(self.sampling), dataclasses.astuple(self.params), state.batch,
                         state.reproducible, torch.get_num_threads())
        self.model_ref = weakref.ref(state.model)
        self.row_codes = state.layout.geometry.row_stride
        return super().start(state, first, p0)

    def _bind_memory(self) -> None:
        """Measured cost model in the same-image-as-AR mode, first step: this model's memory at these settings
        becomes the prior, its rel samples and probe counts this generation's own. The generation still starts at
        the largest window (its first steps credit every smaller one): a start at the window the memory rated best
        locked a demo run into window 8 for good once an early estimate had rated 16 low (nothing but a run of 16
        measures its tokens)."""
        model = self.model_ref() if self.model_ref is not None else None
        # only where the image does not depend on auto's choices (same image as AR): with it off, a seed must
        # give the same image again while the model keeps its calibration (docs/REPRODUCIBLE.md), and a prior
        # that every generation moves would change the choices, so the image, from one run to the next
        if self.cost_model != "measured" or model is None or not self.same_image:
            return
        key = self.settings + (tuple(sorted(self.forward_cost.items())),)
        self.memory = _MEMORY.setdefault(model, {}).setdefault(key, AutoMemory.empty(self.shapes))
        self.memory.generations += 1
        self.samples, self.probes = self.memory.samples, self.memory.probes
        self._rel, self._load = {}, None
        self.prior = {w: self.memory.prior(w) for w in self.shapes}

    def reset_policy(self) -> None:
        """The host policy's state, new for every generation (the measured cost model binds the model's memory
        at the first step: `_bind_memory`)."""
        self.window = next(iter(self.shapes))  # the largest window, drafted by the configured init in `start`
        # the window `choose` last chose: the incumbent of its switch margins (a probe runs another window for a
        # step without becoming it: a probe of a smaller window once kept auto there until the next probe)
        self.choice = self.window
        self.memory, self.model_ref = None, None  # `start` sets the model (a policy run without one has no memory)
        self.prior = {w: prior_tokens_per_step(w) for w in self.shapes}  # tokens per step before this generation's
        self.tokens = {w: 0.0 for w in self.shapes}  # window -> tokens per step, summed over its counted steps
        self.counted = {w: 0 for w in self.shapes}
        self.used = {w: 0 for w in self.shapes}  # steps per window
        self.probes = {w: 0 for w in self.shapes}  # probes per window (the memory's: all generations)
        self.probed = {w: 0 for w in self.shapes}  # probes per window in this generation
        self.samples = {w: deque(maxlen=RECENT) for w in self.shapes}
        self.recent = deque(maxlen=LOAD_STEPS)  # (window, step time / calibrated forward) of the last steps
        self._rel, self._load = {}, None  # rel(w) and load() until the next measurement
        self.measured_at = {w: -1 for w in self.shapes}
        self.preferred = self.inits[0]
        self.init_recent = {i: deque(maxlen=INIT_COMPARED) for i in self.inits}  # (window, tokens) of scored steps
        self.trials = []  # per trial block: (other init, its tokens per step, the preferred's, at the window)
        self.init_used = {i: 0 for i in self.inits}
        self.trial_end = None  # the step after the current trial block (None: no block running)
        self.next_trial = WARMUP_STEPS + INIT_TRIAL_AFTER
        self.trials_lost = 0
        self.prev_step = None  # the previous step: (window, start time, fresh drafts verified, init, init scored)
        self.done = 1.0  # tokens per row committed before this step (the prefill's first)
        self.row_codes = 0  # positions of the image's first row (`start`; 0: a policy run without a generation)
        self.explore_window, self.explore_left = 0, 0  # an upward probe block: its window, its steps still to run
        self.probing = False  # this step is a single probe step (`one_off`)
        self.reach = self.window  # the largest window of the last two steps: what is drafted ahead
        self.tree_rows, self.tree_added = 0, 0.0  # rows that carried the proactive tree, the tokens it added
        self.tree_steps = 0

    def host_hint(self, state: LoopState):
        """The last step's counts (`AutoState.committed`), then the rows that want the proactive tree now."""
        ds = state.draft
        if not self.tree_windows:
            return ds.committed
        return torch.cat([ds.committed, (ds.in_tree & state.active).sum().reshape(1)])

    def tree_gain(self) -> float:
        """Tokens per row the proactive branches add on a step that carries them: what they added so far (the
        accepted depth where a branch won depth 1; the chain alone would have committed the one token after its
        rejected first draft), shrunk towards TREE_GAIN_PRIOR by PRIOR_STEPS pseudo-rows."""
        return shrunk(TREE_GAIN_PRIOR, self.tree_added, self.tree_rows)

    def tree_pays(self, window: int) -> bool:
        """Carry the proactive branches on this step (rows want them): where the window may, when the tokens
        they add per step outweigh their cost: rate with them > rate without (forwards: whenever they add any)."""
        if window not in self.tree_windows:
            return False
        tokens = self.expected_tokens()[window]
        return (tokens + self.tree_gain()) / self.cost(window, True) > tokens / self.cost(window)

    def expected_tokens(self) -> dict:
        """Tokens per step expected from each window: the mean over its steps so far in this generation, shrunk
        towards its prior by PRIOR_STEPS pseudo-steps. The prior: earlier generations' (`AutoMemory`) or the
        formula, but at least the next smaller window's estimate grown as the formula grows (the formula's shape,
        this model's scale: the demo-fitted formula underrates a window on a model whose smaller windows commit
        more, and credits never measure a larger window than auto runs); and the estimate is at least the smaller
        window's (a window commits at least what its first drafts would: the credits)."""
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
        return {w: tokens[w] / self.cost(w) for w in self.shapes}

    def choose(self, state: LoopState) -> int:
        """The window of the best predicted rate; the current one is kept unless another beats it
        by SWITCH_MARGIN (a switch costs: the drafts a new window reaches are fresh). It reads only
        what earlier steps left (counts, costs), never `state`'s drafts of this step: a choice
        that depended on them would bias which drafts get verified (tests/test_auto.py plants one)."""
        rate = self.rates()
        best = max(self.shapes, key=lambda w: (rate[w], w))
        margin = SWITCH_DOWN_MARGIN if 0 < best < self.choice else SWITCH_MARGIN
        return best if rate[best] > margin * rate[self.choice] else self.choice

    def probe(self, state: LoopState, window: int) -> Optional[int]:
        """The runner-up window when this step is a probe (every PROBE_EVERY steps after the warm-up, the
        runner-up not measured in the last PROBE_EVERY x (1 + its probes beyond REL_PRIOR, at most 3) steps),
        else None. Step counts and costs only."""
        s = state.step - WARMUP_STEPS
        if self.cost_model != "measured" or s <= 0 or s % PROBE_EVERY or len(self.shapes) < 2:
            return None
        rate = self.rates()
        runner_up = max((w for w in self.shapes if w != window), key=lambda w: (rate[w], w))
        # plain AR first while probes have not measured it (rel samples: 2 move its low median): its tokens per step
        # are known (1), its cost is not. Its prior, the calibrated forward times a load measured on drafting steps,
        # leaves out that an AR step drafts nothing; where drafting work dominates a step (a large vocabulary, a
        # small model: the flat regime, issue 36) that rated AR 1.5x slower than it ran, it was never the runner-up,
        # and auto ran 2x slower than plain AR
        # (the second AR probe only when the first found AR's cost more than AR_AGREES off its prior: where the first
        # agrees, as on the demo model, a second AR step is a step lost, about 1.5% of a demo image's time)
        ar = self.samples[0] if 0 in self.shapes else ()
        if window and 0 in self.shapes and len(ar) < REL_PRIOR and \
                not (ar and 1 / AR_AGREES < ar[-1] < AR_AGREES):
            runner_up = 0
        # then the next larger window while few steps measured its tokens (in this generation and the memory): the
        # credits of the windows auto runs measure every smaller window, never a larger one, and a larger window
        # whose estimate is still the prior's is not the runner-up where the prior underrates it (the demo model)
        # (where it could pay at all: W + 1 tokens, all it can commit, per its step cost beat the current rate)
        counted = self.memory.counted if self.memory is not None else self.counted
        larger = [w for w in self.order if w > window]
        if runner_up != 0 and larger and counted[larger[0]] < PRIOR_STEPS and \
                (larger[0] + 1) / self.cost(larger[0]) > rate[window]:
            return larger[0]
        # a window probed often without being chosen is probed less often (up to 4x PROBE_EVERY apart), after the
        # REL_PRIOR + 1 probes its rel needs to leave the calibration, or at once when its last probe agreed with
        # its rel within PROBE_AGREES (each probe of a window auto does not run costs the tokens it commits less)
        samples = self.samples[runner_up]
        agreed = bool(samples) and 1 / PROBE_AGREES < samples[-1] / self.rel(runner_up) < PROBE_AGREES
        stale = PROBE_EVERY * (4 if agreed else min(1 + max(self.probes[runner_up] - REL_PRIOR, 0), 4))
        return runner_up if state.step - self.measured_at[runner_up] >= stale else None

    def compare(self, trial: str, preferred: str) -> Optional[tuple]:
        """(window, the trial init's low-median tokens per step, the preferred init's) over their last scored steps
        at the window of the trial's last scored step: like for like, close in time; None without both."""
        if not self.init_recent[trial]:
            return None
        window = self.init_recent[trial][-1][0]
        mine = [n for w, n in self.init_recent[trial] if w == window]
        theirs = [n for w, n in self.init_recent[preferred] if w == window]
        if not theirs:
            return None
        return window, median_low(mine), median_low(theirs)  # medians: tokens per step are heavy-tailed

    def other_init(self) -> str:
        return self.inits[1] if self.preferred == self.inits[0] else self.inits[0]

    def choose_init(self, state: LoopState, window: int) -> str:
        """The init of this step's fresh drafts: the preferred one, except in a trial block of the other.
        A block starts at a scheduled step (the first `INIT_TRIAL_AFTER` steps after the warm-up, then
        INIT_TRIAL_EVERY x (1 + trials the other init lost, at most 3) after the last block) when there is
        room to gain: the current window's steps commit under TRIAL_BELOW of what it could. After the
        block the preferred init is revised. Step counts and token counts only."""
        if len(self.inits) < 2:
            return self.preferred
        step, other = state.step, self.other_init()
        if self.trial_end is not None and step >= self.trial_end:  # a block just ended: revise
            self.trial_end = None
            seen = self.compare(other, self.preferred)
            # the configured init is the default: another must beat it by INIT_MARGIN, it wins back on a tie
            margin = 1.0 / INIT_MARGIN if other == self.inits[0] else INIT_MARGIN
            won = seen is not None and seen[1] >= margin * seen[2]
            if seen is not None:
                self.trials.append((other, round(seen[1], 2), round(seen[2], 2), seen[0], won))
            if won:
                self.preferred, other = other, self.preferred
            else:
                self.trials_lost += 1
            # the configured init, once beaten, is tried again soon; a losing alternative ever less often
            self.next_trial = step + (INIT_TRIAL_EVERY // 2 if self.preferred != self.inits[0]
                                      else INIT_TRIAL_EVERY * min(1 + self.trials_lost, 4))
        if self.trial_end is None and step >= self.next_trial and window and self.counted[window] >= INIT_TRIAL_SEEN:
            self.next_trial = step + INIT_TRIAL_EVERY
            seen = self.tokens[window] / self.counted[window] if self.counted[window] else 0.0
            if self.preferred != self.inits[0] or seen < TRIAL_BELOW * (window + 1):
                self.trial_end = step + INIT_TRIAL_STEPS
        return other if self.trial_end is not None else self.preferred

    def plan(self, state: LoopState, hint: list) -> JacobiPlan:
        """The previous step's tokens and wall time into the estimates, then this step's window and init
        (host only)."""
        now = self.clock() if self.cost_model == "measured" else 0.0
        n = len(self.order)
        tokens, rows, credits = hint[0], hint[1], hint[2:2 + n]
        tree_rows, tree_added, want_tree = (list(hint[2 + n:2 + n + 3]) + [0, 0, 0])[:3]
        if self.prev_step is None:
            self._bind_memory()
        if self.prev_step is not None and rows:  # the previous step: its tokens and its wall time
            w, t, fresh, init, scored, tree = self.prev_step
            if tree_rows:  # what the branches added (every tree step counts: its gain is the branches', not the window's)
                self.tree_rows += tree_rows
                self.tree_added += tree_added
            first_row = self.done < self.row_codes
            self.done += (tokens + tree_added) / rows
            # not counted: the first steps, a step whose window reached undrafted positions, and steps in the first
            # image row, whose drafts have no row above (sample_above's source): there a long window commits little,
            # and a start measured there once sent a demo run to window 8 for good
            if state.step > WARMUP_STEPS and not fresh and not first_row:
                per_row = tokens / rows
                self._count(w, per_row)
                for smaller, credit in zip(self.order, credits):  # what each smaller window would have committed
                    if smaller < w:
                        self._count(smaller, credit / rows)
                if scored:
                    self.init_recent[init].append((w, per_row))
            if self.cost_model == "measured":
                self._measure(w, now - t, state.step - 1, tree)
        window = self.choice = self.choose(state)
        self.probing = False
        if self.explore_left:  # an upward probe block goes on
            window, self.explore_left = self.explore_window, self.explore_left - 1
        else:
            probe = self.probe(state, window)
            if probe is not None:
                if probe > window:  # its tokens are measured only by steps after its first: a block
                    self.explore_window, self.explore_left = probe, EXPLORE_STEPS - 1
                else:  # one step of a smaller window (or AR): a one-off for the compiled step
                    self.probing = True
                window = probe
                self.probes[window] += 1
                self.probed[window] += 1
        init = self.choose_init(state, window)
        init = init if window else None  # an AR step drafts nothing (one graph, whatever the init)
        # positions the window reaches for the first time get drafted by `init` (in `propose`) when it is larger
        # than the last step's: every step's `observe` drafts up to its new frontier + its own window, so a window
        # no larger than the last one reaches only drafted positions (a grow step with an empty mask would cost an
        # init pass, 3-4% of a demo generation's time, for nothing). `start` drafted for the first window.
        last = self.prev_step[0] if self.prev_step is not None else self.window
        # compiled, every drafting step grows (an empty mask when the window did not): one graph per window, not
        # two (a plan first met in a later generation compiles there, seconds on a CPU)
        grow = window > last or (self.compiled_step and window > 0)
        # the branches pay at this window: carried now where rows want them, and built for the next step only then
        # (their draws and their build cost an eager step time; the next step most often runs this window)
        branches = self.tree_pays(window)
        tree = want_tree > 0 and branches
        self.tree_steps += tree
        fresh = window > self.reach  # drafts no earlier step of the last two made: not the window's steady rate
        scored = bool(window) and self.prev_step is not None and self.prev_step[3] == init
        self.reach = max(window, self.window)
        self.window = window
        self.used[window] += 1
        if init is not None:
            self.init_used[init] += 1
        self.prev_step = (window, now, fresh, init, scored, tree)
        return JacobiPlan(window, tree=tree, grow=grow, init=init, branches=branches)

    def one_off(self, plan) -> bool:
        """A probe of a smaller window (or AR) is one step: compiled, it runs eager rather than compiling a graph
        for a plan the generation does not run (engine.StepGraphs)."""
        return self.probing

    def _count(self, window: int, tokens: float) -> None:
        """One counted step of `window` that committed `tokens` per row: this generation's estimate and the memory."""
        self.tokens[window] += tokens
        self.counted[window] += 1
        if self.memory is not None:
            self.memory.count(window, tokens)

    def observe(self, state: LoopState, plan, tree, verdict, p_all, out, previous_frontier):
        active = state.active
        carried = state.draft.in_tree & active  # the rows this step verified with the branches (when plan.tree)
        ds = super().observe(state, plan, tree, verdict, p_all, out, previous_frontier)
        n = torch.where(active, verdict.n_accepted + 1, 0)
        if plan.tree:  # a branch won depth 1 where the line's first slot is a branch slot (past the chain's T)
            won = (verdict.path[:, 1] >= self.shapes[plan.window][0]) & carried
            # the windows' counts are the chain's: where a branch won, the chain alone committed one token (its
            # first draft was rejected); what the branch added is counted apart (`tree_gain`)
            chain_n = torch.where(won, 1, n)
            branch = torch.stack([carried.sum(), (n - chain_n).sum()])
        else:
            chain_n, branch = n, torch.zeros(2, dtype=torch.long, device=state.device)
        credits = torch.minimum(chain_n[None, :], self.order_t[:, None] + 1).sum(1)  # [windows]: min(n, W + 1)
        ds.committed = torch.cat([torch.stack([chain_n.sum(), active.sum()]), credits, branch])
        return ds

    def fell_back_to_ar(self) -> Optional[str]:
        """One line when most steps were plain AR steps (None otherwise): how many, and why, from the estimates
        at the end of the generation."""
        total = sum(self.used.values())
        if 0 not in self.shapes or not total or self.used[0] <= FALLBACK_SHARE * total:
            return None
        rate = self.rates()
        drafting = [w for w in self.shapes if w]
        best = max(drafting, key=lambda w: (rate[w], w))
        return (f"auto fell back to plain AR for {self.used[0]} of {total} steps: its best drafting window, "
                f"{best}, was estimated at {self.expected_tokens()[best]:.1f} tokens per step for "
                f"{self.cost(best) / self.cost(0):.1f}x an AR step's cost, {rate[best] / rate[0]:.2f}x AR's tokens "
                f"per second")

    def report(self) -> dict:
        """What auto chose and why: steps per window and per init, each window's cost and expected tokens per
        step at the end of the generation (the last estimates), the probes, and whether it fell back to AR."""
        measured = self.cost_model == "measured"
        steps = sum(self.used.values())
        main = max(self.used, key=lambda w: (self.used[w], w))
        init_main = max(self.init_used, key=lambda i: (self.init_used[i], i == self.inits[0]))
        chose = (f"window {main} for {self.used[main]} of {steps} steps"
                 + (f", init {init_main} for {self.init_used[init_main]} of {sum(self.init_used.values())} "
                    f"drafting steps" if sum(self.init_used.values()) else ""))
        return {
            "cost_model": self.cost_model,
            "chose": chose,
            "fell_back_to_ar": self.fell_back_to_ar(),
            "steps_per_window": {str(w): n for w, n in sorted(self.used.items()) if n},
            "probe_steps": {str(w): n for w, n in sorted(self.probed.items()) if n},
            "tokens_per_step": {str(w): round(self.tokens[w] / n, 2) for w, n in sorted(self.counted.items()) if n},
            "steps_per_init": {i: n for i, n in self.init_used.items() if n},
            # steps that carried SJD-PAC's proactive branches, and the tokens per row they were estimated to add
            "tree_steps": self.tree_steps,
            "tree_gain": round(self.tree_gain(), 3) if self.tree_windows else None,
            # per trial block: the init tried, its tokens per step, the preferred init's just before, the window,
            # whether the trial won (the preference switched)
            "init_trials": [dict(zip(("init", "tokens_per_step", "preferred_tokens_per_step", "window", "won"), t))
                            for t in self.trials],
            "init_preferred": self.preferred,
            "load": round(self.load(), 3) if measured else None,  # step time / calibrated forward time, now
            "step_cost_ms": {str(w): round(1e3 * self.cost(w), 3) for w in sorted(self.shapes)} if measured else None,
            "rel_cost": {str(w): round(self.rel(w), 3) for w in sorted(self.shapes) if self.samples[w]}
            if measured else None,
            "expected_tokens_per_step": {str(w): round(n, 2) for w, n in sorted(self.expected_tokens().items())},
            # earlier generations on this model at these settings whose measurements were this one's prior
            "earlier_generations": self.memory.generations - 1 if self.memory is not None else 0,
            "rule": "each step: the window maximising expected tokens per step / step cost (re-measured each step, "
                    "low medians; a probe of the runner-up every %d steps) and the init whose drafts commit more "
                    "(a trial block of the other when drafts commit under %.0f%% of the window), from earlier "
                    "steps only" % (PROBE_EVERY, 100 * TRIAL_BELOW),
        }


def auto_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """The windows auto chose, each with its share of the steps (`steps_per_window` of the backend reports); the
    share of steps that carried the proactive branches ((K - 1) x D more nodes) spread over the drafting windows."""
    counts: dict = {}
    tree_steps = 0
    for report in reports:
        for w, n in report.get("steps_per_window", {}).items():
            counts[int(w)] = counts.get(int(w), 0) + n
        tree_steps += report.get("tree_steps") or 0
    if not counts:
        raise KeyError("steps_per_window")
    total = sum(counts.values())
    drafting = sum(n for w, n in counts.items() if w)
    tree_share = tree_steps / drafting if drafting else 0.0
    branch_nodes = (p.get("tree_width", 1) - 1) * p.get("tree_depth", 0)
    shapes = []
    for w, n in sorted(counts.items()):
        if not w:
            shapes.append((1, n / total))
            continue
        shapes.append((chain_tokens(w, row_codes), n / total * (1 - tree_share)))
        if tree_share and branch_nodes:
            shapes.append((chain_tokens(w, row_codes) + branch_nodes, n / total * tree_share))
    return StepCost(tuple((t, s) for t, s in shapes if s > 0))


AUTO = Method("auto", "Auto", "SCD whose window and draft init are chosen every step from this device's step cost, "
              "measured during the generation, and the acceptance seen so far (lossless; docs/ARCHITECTURE.md)", AutoParams, AutoDrafter,
              step_cost=auto_step_cost)

__all__ = ["AutoDrafter", "AutoParams", "AUTO", "candidate_windows"]

