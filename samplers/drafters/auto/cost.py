"""auto's cost model: the seconds a step of each window costs now. `forwards`: 1 (fewest forwards, no clock read).
`measured`: cost(W) = calibrated(W) x rel(W) x load, each measured, none taken once:
- calibrated(W): the engine's timing of W's forward before the first step (`set_costs`; 1 when untimed);
- rel(W): the low median of W's last RECENT samples of (step time / calibrated(W)) over the same ratio of the
  other windows among the last LOAD_STEPS steps (each over its rel: so under the same load), with REL_PRIOR
  pseudo-samples of 1: a calibration one busy moment distorted is corrected by the steps themselves;
- load: the low median of the last LOAD_STEPS steps' time / calibrated / rel: the load, on every window.
One odd step moves neither median."""
from __future__ import annotations

from collections import deque
from statistics import median_low

RECENT = 8  # step-time samples kept per window (rel)
REL_PRIOR = 2  # pseudo-samples of rel = 1 (the calibration) in rel's median
LOAD_STEPS = 5  # steps in the load estimate


class CostModel:
    def __init__(self, kind: str, windows):
        self.kind, self.measured, self.windows = kind, kind == "measured", tuple(windows)
        self.forward, self.tree = {}, {}  # window -> calibrated seconds of its chain / its chain with the branches
        self.reset()

    def reset(self) -> None:
        """A new generation: nothing measured (a memory may hand its rel samples over: `WindowPolicy.bind`)."""
        self.samples = {w: deque(maxlen=RECENT) for w in self.windows}  # window -> rel samples
        self.recent = deque(maxlen=LOAD_STEPS)  # (window, step time / calibrated forward) of the last steps
        self.measured_at = {w: -1 for w in self.windows}  # the last step that measured each window
        self.forget()

    def forget(self) -> None:
        self._rel, self._load = {}, None  # rel(w) and load() memos until the next measurement

    def set_costs(self, seconds: dict) -> None:
        """The engine's timings of `AutoDrafter.cost_shapes`: {window: s, ("tree", window): s}."""
        self.forward = {k: v for k, v in seconds.items() if not isinstance(k, tuple)}
        self.tree = {k[1]: v for k, v in seconds.items() if isinstance(k, tuple)}

    def calibrated(self, window: int, tree: bool = False) -> float:
        return (self.tree if tree else self.forward).get(window, 1.0)

    def rel(self, window: int) -> float:
        """Window's measured step cost over its calibrated forward, relative to the load (1: not run yet)."""
        if window not in self._rel:  # a plan asks for it dozens of times
            samples = self.samples[window]
            self._rel[window] = median_low(list(samples) + [1.0] * REL_PRIOR) if samples else 1.0
        return self._rel[window]

    def load(self) -> float:
        if self._load is None:
            self._load = median_low([ratio / self.rel(w) for w, ratio in self.recent]) if self.recent else 1.0
        return self._load

    def cost(self, window: int, tree: bool = False) -> float:
        """Seconds per step now; with the proactive branches their calibrated forward (same rel and load)."""
        if not self.measured:
            return 1.0
        return self.calibrated(window, tree) * self.rel(window) * self.load()

    def measure(self, window: int, seconds: float, step: int, tree: bool = False) -> None:
        """One step's wall time into the load and, when the last steps ran other windows, into rel(window): the
        window auto keeps running gets no rel sample from its own steps (the load absorbs what they say)."""
        ratio = seconds / self.calibrated(window, tree)
        others = [r / self.rel(w) for w, r in self.recent if w != window]
        if others:
            self.samples[window].append(ratio / median_low(others))
        self.recent.append((window, ratio))
        self.measured_at[window] = step
        self.forget()
