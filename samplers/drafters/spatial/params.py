"""Spatial's parameters (samplers/drafters/params.py): a Jacobi window with SJD-PAC's proactive drafting
and adaptive continuation, and the trained heads that draft entering positions."""
from dataclasses import dataclass

from ..jacobi import WINDOW_HELP, ProactiveParams, SJDPACParams
from ..params import INITS, MAX_WINDOW, Method, param, same_param


@dataclass(frozen=True)
class SpatialParams(ProactiveParams):
    window: int = param(64, WINDOW_HELP, lo=1, hi=MAX_WINDOW, paper="SJD-PAC paper: 64", sizes=True, essential=True)
    head_depths: int = param(2, "spatial heads used: a position entering the window is drafted from the target's "
                             "states 1..head_depths rows above it (0: no heads, `init` alone)", lo=0, hi=4,
                             paper="Hawk paper: vertical heads", essential=True)
    head_below: float = param(0.2, "a head drafts an entering position only where the draft distribution recorded "
                              "one row above has its largest probability below this (flat regions keep `init`; 1: "
                              "heads wherever they reach)", lo=0.0, hi=1.0)
    init: str = param("sample_above", "how entering positions no head reaches (the first rows) are drafted: "
                      + ", ".join(INITS), choices=INITS, paper="SJD paper: random")
    # proactive drafting and adaptive continuation: SJD-PAC's parameters
    # depth 3 (SJD-PAC's paper) compresses most with spatial's 64-token window (11.57x vs 9.85x at depth 2,
    # docs/figures/spatial_tree_depth.json), unlike sjd_pac's window 16
    tree_depth: int = same_param(SJDPACParams, "tree_depth", default=3, paper="SJD-PAC paper: D = 3")
    tree_width: int = same_param(SJDPACParams, "tree_width")
    continuation: bool = same_param(SJDPACParams, "continuation")
    coupling: str = same_param(SJDPACParams, "coupling")
    # 5, not sjd_pac's 0: spatial's restart was not measured across regimes (its figures are at 5)
    restart_after: int = same_param(SJDPACParams, "restart_after", default=5)
    heads: str = param("", "spatial heads folder; empty: spatial_heads/ beside the model's weights",
                       folder_of="spatial", essential=True)


SPATIAL = Method("spatial", "Spatial (experimental)", "a Jacobi window over the rows ahead, drafted by trained spatial "
                 "heads from the rows above and refined by the target, with proactive branches (Hawk + SJD-PAC + SCD). With "
                 "same_image_as_ar on it commits fewer tokens per forward than sjd_pac at window 64 on the demo model "
                 "and is slower on a CPU; it leads only with it off in the paper regime (docs/BENCHMARKS.md)",
                 SpatialParams, ".spatial.drafter:SpatialDrafter", drafter_kind="spatial",
                 train="spatial:train_spatial", experimental=True)
