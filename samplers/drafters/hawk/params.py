"""Hawk's parameters (samplers/drafters/params.py)."""
from dataclasses import dataclass

from ..params import param


@dataclass(frozen=True)
class HawkParams:
    horizontal_heads: int = param(3, "horizontal heads: positions T+1..T+n after the pending token", lo=1, hi=16,
                                  paper="Hawk paper: Medusa-style heads (preset='paper': 4, our tree of docs/HAWK.md)")
    vertical_depth: int = param(1, "vertical heads: rows below (T + d * row) kept in the speculation cache", lo=0,
                                hi=4, paper="Hawk paper: VSD")
    candidates: int = param(2, "candidates drawn from each head's distribution at a position", lo=1, hi=16,
                            essential=True)
    node_budget: int = param(8, "nodes per forward (pending token included); the tree is padded to it", lo=2,
                             hi=512, paper="preset='paper': 32", sizes=True, essential=True)
    vertical_reach: int = param(0, "tree levels past the horizontal heads drafted from the vertical cache alone "
                                "(0: the paper's tree; needs vertical_depth >= 1)", lo=0, hi=64, paper="Hawk paper: 0")
    chain_prior: float = param(0.6, "tree shape: assumed acceptance of a node's first child (higher: deeper, "
                               "narrower trees within node_budget)", lo=0.05, hi=0.95)
    heads: str = param("", "heads folder; empty: hawk_heads/ beside the model's weights", folder_of="hawk",
                       essential=True)
