"""Hawk's parameters (samplers/drafters/params.py)."""
from dataclasses import dataclass

from ..params import Method, param


@dataclass(frozen=True)
class HawkParams:
    horizontal_heads: int = param(3, "horizontal heads: positions T+1..T+n after the pending token", lo=1, hi=16,
                                  paper="Hawk paper: Medusa-style heads (preset='paper': 4, our tree of docs/HAWK.md)")
    vertical_depth: int = param(1, "vertical heads: rows below (T + d * row) kept in the speculation cache", lo=0,
                                hi=4, paper="Hawk paper: VSD")
    candidates: int = param(2, "candidates drawn from each head's distribution at a position", lo=1, hi=16,
                            essential=True)
    node_budget: int = param(0, "nodes per forward (pending token included); the tree is padded to it; 0: chosen "
                             "per model and device from the measured costs of the heads and the target (at most 8)",
                             lo=0, hi=512, paper="preset='paper': 32", sizes=True, essential=True)
    vertical_reach: int = param(0, "tree levels past the horizontal heads drafted from the vertical cache alone "
                                "(0: the paper's tree; needs vertical_depth >= 1)", lo=0, hi=64, paper="Hawk paper: 0")
    chain_prior: float = param(0.6, "tree shape: assumed acceptance of a node's first child (higher: deeper, "
                               "narrower trees within node_budget)", lo=0.05, hi=0.95)
    heads: str = param("", "heads folder; empty: hawk_heads/ beside the model's weights", folder_of="hawk",
                       essential=True)

    def check(self) -> None:
        if self.node_budget == 1:
            raise ValueError("node_budget must be 0 (chosen from the measured costs) or at least 2 (the pending token "
                             "and a draft), got 1")

HAWK = Method("hawk", "Hawk", "spatial (horizontal + vertical) draft heads with a speculation cache (Chen et al.)",
              HawkParams, ".hawk.drafter:HawkDrafter", paper_preset=(("horizontal_heads", 4), ("node_budget", 32)),
              drafter_kind="hawk", train="hawk:train_hawk")
