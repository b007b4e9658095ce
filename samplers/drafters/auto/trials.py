"""auto's init trials (`adapt_init`): the init of the positions a step drafts afresh, the preferred one except in
a trial block of the other, which becomes the preferred one when its drafts commit INIT_MARGIN more."""
from __future__ import annotations

from collections import deque
from statistics import median_low
from typing import Optional

from .window import WARMUP_STEPS

INIT_TRIAL_AFTER = 4  # steps after the warm-up before the first trial block of the other init
INIT_TRIAL_EVERY = 32  # steps between trial blocks (times 1 + the trials the other init lost, at most 4x)
INIT_TRIAL_STEPS = 4  # steps of a trial block (the first verifies the preferred init's drafts: not scored)
INIT_TRIAL_SEEN = 2  # counted steps of the current window before a trial (its tokens per step tell the room)
TRIAL_BELOW = 0.5  # a trial only when the window's steps commit under this share of window + 1 tokens
INIT_COMPARED = 6  # scored steps of each init kept for the comparison after a trial block
INIT_MARGIN = 1.15


def candidate_inits(init: str) -> tuple:
    """The configured init, then the one auto tries beside it: random, or sample_above when random is configured."""
    return (init, "sample_above" if init == "random" else "random")


class InitTrials:
    def __init__(self, inits: tuple):
        self.inits = inits  # the configured init first (one: no trials)
        self.reset()

    def reset(self) -> None:
        self.preferred = self.inits[0]
        self.recent = {i: deque(maxlen=INIT_COMPARED) for i in self.inits}  # (window, tokens) of scored steps
        self.trials = []  # per block: (the init tried, its tokens per step, the preferred's, the window, won)
        self.used = {i: 0 for i in self.inits}  # drafting steps per init
        self.trial_end = None  # the step after the running trial block (None: none running)
        self.next_trial = WARMUP_STEPS + INIT_TRIAL_AFTER
        self.lost = 0  # trials the other init lost

    def score(self, init: str, window: int, tokens: float) -> None:
        """A counted step that drafted with the same init as the step before it: `tokens` per row at `window`."""
        self.recent[init].append((window, tokens))

    def compare(self, trial: str, preferred: str) -> Optional[tuple]:
        """(window, the trial init's low-median tokens per step, the preferred init's) over their last scored steps
        at the window of the trial's last scored step: like for like, close in time; None without both."""
        if not self.recent[trial]:
            return None
        window = self.recent[trial][-1][0]
        mine = [n for w, n in self.recent[trial] if w == window]
        theirs = [n for w, n in self.recent[preferred] if w == window]
        if not theirs:
            return None
        return window, median_low(mine), median_low(theirs)  # medians: tokens per step are heavy-tailed

    def choose(self, step: int, window: int, tokens: float, counted: int) -> str:
        """This step's init. A block of INIT_TRIAL_STEPS starts at a scheduled step when the window's `counted`
        steps (at least INIT_TRIAL_SEEN) committed under TRIAL_BELOW of window + 1 tokens each (room to gain), or
        while the configured init is not the preferred one; the block's end revises the preference."""
        if len(self.inits) < 2:
            return self.preferred
        other = self.inits[1] if self.preferred == self.inits[0] else self.inits[0]
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
                self.lost += 1
            # the configured init, once beaten, is tried again soon; a losing alternative ever less often
            self.next_trial = step + (INIT_TRIAL_EVERY // 2 if self.preferred != self.inits[0]
                                      else INIT_TRIAL_EVERY * min(1 + self.lost, 4))
        if self.trial_end is None and step >= self.next_trial and window and counted >= INIT_TRIAL_SEEN:
            self.next_trial = step + INIT_TRIAL_EVERY
            seen = tokens / counted if counted else 0.0
            if self.preferred != self.inits[0] or seen < TRIAL_BELOW * (window + 1):
                self.trial_end = step + INIT_TRIAL_STEPS
        return other if self.trial_end is not None else self.preferred
