"""The Jacobi family's parameters (samplers/drafters/params.py): what a Jacobi-family drafter reads, and
each method's typed dataclass (AR, SJD, SCD, SJD-PAC; spatial's extends `ProactiveParams`, auto's
`JacobiParams`), with the help texts they share."""
from dataclasses import dataclass
from typing import ClassVar

from ..params import COUPLINGS, INITS, MAX_TREE_WIDTH, MAX_WINDOW, Method, param

WINDOW_HELP = "draft tokens verified per forward (shrinks near the end of the image)"
INIT_HELP = "how new window positions are drafted: " + ", ".join(INITS)
# sample_above (from the distribution recorded one row above): the fastest lossless init on the demo model for sjd,
# scd, sjd_pac and auto, >= 0.97x the papers' random at window 16 in every bench regime (measured 2026-11-27)
INIT_ABOVE_PAPER = "SJD paper: random (preset='paper'); sample_above is the fastest on the demo model"
INIT_ABOVE_REGIMES = ("SJD paper: random (preset='paper'); sample_above: >= 0.97x the paper's setting at window 16 in "
                      "every bench regime")


def restart_param(default: int):
    """Stall restart (`JacobiDrafter._stalled_rows`): ours, not the papers' (preset='paper': off). Its default per
    method is what every bench regime measured fastest (2026-11-27)."""
    return param(default, "re-draft the window by `init` after this many steps in a row that committed one token each "
                 "(a coupled Jacobi window stuck in a fixed point); 0: never", lo=0, hi=1024,
                 paper="not in the papers (preset='paper': 0)")


class JacobiParams:
    """What a Jacobi-family drafter reads from its parameters. A method sets by class attributes
    what it does not expose as a parameter: AR's empty window, SJD's independent re-drafts, the
    absence of a proactive tree."""

    window: ClassVar[int] = 0  # image drafts per forward (0: AR)
    init: ClassVar[str] = "random"
    redraft: ClassVar[str] = "independent"  # how unreached positions are re-drafted: independent, maximal, gumbel
    coupling_strength: ClassVar[float] = 0.0  # probability of a coupled re-draft (redraft != independent)
    tree_width: ClassVar[int] = 1  # proactive drafting: K candidates at the first open position (1: off)
    tree_depth: ClassVar[int] = 1
    restart_after: ClassVar[int] = 0  # stall restart (AR: nothing to restart)

    @property
    def windows(self) -> tuple:
        """The windows the drafter may use: one for a fixed backend; `auto` offers several."""
        return (self.window,)


@dataclass(frozen=True)
class SJDParams(JacobiParams):
    window: int = param(16, WINDOW_HELP, lo=1, hi=MAX_WINDOW, paper="SJD paper: 16 (32 and 64 also studied)",
                        sizes=True, essential=True)
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_REGIMES)
    restart_after: int = restart_param(0)


@dataclass(frozen=True)
class SCDParams(JacobiParams):
    window: int = param(16, WINDOW_HELP, lo=1, hi=MAX_WINDOW, paper="SCD paper: 16-64", sizes=True, essential=True)
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_REGIMES)
    coupling: str = param("maximal", "how re-drafts are coupled to the previous draft: maximal or gumbel",
                          choices=COUPLINGS, paper="SCD paper: maximal", essential=True)
    coupling_strength: float = param(1.0, "alpha: probability of a coupled (vs independent) re-draft", lo=0.0, hi=1.0,
                                     paper="SCD paper: 1.0 (0 = plain SJD re-drafting)")
    restart_after: int = restart_param(0)

    @property
    def redraft(self) -> str:
        return self.coupling


class ProactiveParams(JacobiParams):
    """SJD-PAC's proactive drafting and adaptive continuation (also spatial's)."""

    coupling_strength: ClassVar[float] = 1.0

    @property
    def redraft(self) -> str:
        return self.coupling if self.continuation else "independent"

    def check(self) -> None:
        if self.tree_depth > self.window:
            raise ValueError(f"tree_depth must be an int in [1, {self.window}], got {self.tree_depth} (a branch "
                             f"cannot be deeper than the window, {self.window})")


@dataclass(frozen=True)
class SJDPACParams(ProactiveParams):
    window: int = param(16, WINDOW_HELP, lo=1, hi=MAX_WINDOW, sizes=True, essential=True,
                        paper="SJD-PAC paper: 64 (preset='paper'); 16 is the fastest on a CPU")
    tree_depth: int = param(2, "proactive drafting: depth D of the branches after a rejection (at most window)",
                            lo=1, hi=MAX_WINDOW, paper="SJD-PAC paper: D = 3 (preset='paper'); 2 is the fastest on "
                            "the demo model", sizes=True, essential=True)
    tree_width: int = param(4, "proactive drafting: candidates K at the first open position (1 = off; at most the "
                            "image vocabulary)", lo=1, hi=MAX_TREE_WIDTH,
                            paper="SJD-PAC paper: K = 4 (the authors' code uses 3)", sizes=True, essential=True)
    continuation: bool = param(True, "adaptive continuation: keep verifying after the first rejection and keep "
                               "passing drafts", paper="SJD-PAC paper: on")
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_REGIMES)
    coupling: str = param("maximal", "the coupling adaptive continuation uses: maximal (the paper's) or gumbel",
                          choices=COUPLINGS, paper="SJD-PAC paper: maximal")
    restart_after: int = restart_param(0)


@dataclass(frozen=True)
class ARParams(JacobiParams):
    """AR: one slot, the pending token, no drafts."""


SJD = Method("sjd", "SJD", "Speculative Jacobi Decoding (Teng et al.)", SJDParams, ".jacobi.drafter:JacobiDrafter",
             paper_preset=(("init", "random"), ("restart_after", 0)),
             bench_variants=("window=32",))
SCD = Method("scd", "SCD", "Speculative Jacobi Decoding with coupled re-drafts (So et al.)", SCDParams,
             ".jacobi.drafter:JacobiDrafter",
             paper_preset=(("init", "random"), ("restart_after", 0)),
             bench_variants=("window=32,coupling=maximal", "window=64,coupling=maximal", "window=32,coupling=gumbel"))
SJD_PAC = Method("sjd_pac", "SJD-PAC", "SJD with proactive drafting and adaptive continuation (Kang et al.)",
                 SJDPACParams, ".jacobi.drafter:JacobiDrafter",
                 paper_preset=(("window", 64), ("tree_depth", 3), ("tree_width", 4), ("init", "random"),
                               ("restart_after", 0)),
                 # the paper's ablation: SJD -> + proactive drafting -> + adaptive continuation -> L=64
                 bench_variants=("window=32,continuation=false", "window=32", "window=64"))
AR = Method("ar", "AR (baseline)", "plain autoregressive sampling, one token per forward (the baseline)", ARParams,
            ".jacobi.drafter:ARDrafter")
