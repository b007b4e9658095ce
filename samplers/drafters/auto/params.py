"""auto's typed parameters, its step shape for a projection and its Method."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..jacobi import INIT_ABOVE_PAPER, INIT_HELP, JacobiParams, restart_param
from ..params import INITS, MAX_TREE_WIDTH, MAX_WINDOW, Method, param
from .window import candidate_windows


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
                             "cost forwards (0.81x step compression at the defaults)")
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


AUTO = Method("auto", "Auto", "SCD whose window and draft init are chosen every step from this device's step cost, "
              "measured during the generation, and the acceptance seen so far (lossless; docs/ARCHITECTURE.md)", AutoParams,
              ".auto.drafter:AutoDrafter")
