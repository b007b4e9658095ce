"""ADT-Tree's parameters (samplers/drafters/params.py) and the ranges of its tree adaptation."""
from __future__ import annotations

from dataclasses import dataclass

from ..params import Method, param

D_RANGE = (1, 9)  # the paper's (0, 10)
K_RANGE = (4, 13)  # the paper's (3, 14)
TREE_INITS = ("left", "above", "random")
CANDIDATE_MODES = ("topk", "sampled")
TREE_SHAPES = ("layers", "best_first")


@dataclass(frozen=True)
class ADTTreeParams:
    node_budget: int = param(0, "nodes per forward (pending token included); the tree is padded to it; 0: chosen per "
                             "model and device from the measured costs of the EAGLE layer and the target (at most 8)",
                             lo=0, hi=512, sizes=True, paper="EAGLE-2's trees (preset='paper': 32)", essential=True)
    tree_init: str = param("left", "where a new tree's depth and width come from: the left neighbour's tree, the one "
                           "above, or random", choices=TREE_INITS, paper="ADT-Tree paper: left (horizontal)")
    adaptive: bool = param(True, "bisection adaptation of depth and width from the previous tree's acceptance (off: a "
                           "fixed EAGLE-2 tree)", paper="ADT-Tree paper: on")
    beta: float = param(1.0, "acceptance-rate threshold of the adaptation", lo=0.0, hi=1.0, paper="ADT-Tree paper: 1")
    depth: int = param(6, "initial (or fixed) tree depth d (adaptive: kept in [1, max_depth] and below node_budget)",
                       lo=1, hi=64, paper="ADT-Tree paper: d in (0, 10) (preset='paper': 5)")
    width: int = param(8, "initial (or fixed) expansion width k: top-k children per node and nodes expanded per layer "
                       "(adaptive: kept in [4, 13]; at most the image vocabulary)", lo=1, hi=13,
                       paper="ADT-Tree paper: k in (3, 14)")
    max_depth: int = param(9, "adaptive: the deepest tree the bisection may grow (below node_budget)", lo=1, hi=64,
                           paper="ADT-Tree paper: 9 (d in (0, 10))")
    candidate_mode: str = param("sampled", "how a node's children are chosen: topk (EAGLE-2's deterministic top-k, "
                                "accepted with the target's mass on them) or sampled (drawn without replacement from "
                                "the drafter's q, accepted with about 1 - TV(p, q); tree shape fixed before drawing)",
                                choices=CANDIDATE_MODES, paper="ADT-Tree paper: topk (EAGLE-2; preset='paper')",
                                essential=True, implies={"topk": {"tree_shape": "layers"}})
    children: int = param(1, "sampled mode: siblings drawn per expanded node; each layer expands max(1, width // "
                          "children) nodes (at most the image vocabulary); 1 (with root_children 0 or 1): the tree "
                          "is one chain, its depth adapted, width unused", lo=1, hi=16,
                          paper="preset='paper': 2 (unused by topk)")
    root_children: int = param(0, "sampled mode: siblings drawn at the root (depth 1), where a step's first draft is "
                               "rejected most often; 0: `children`. root_children=R, children=1, width=R: R chains",
                               lo=0, hi=16)
    tree_shape: str = param("layers", "sampled trees: layers (`depth` layers of `width` nodes, `children` siblings "
                            "each) or best_first (the best static tree of node_budget - 1 drafts under the acceptance "
                            "guesses below, grown greedily as Sequoia's; ignores depth, width, children; adaptive: "
                            "each step picks from a family of such shapes, deeper after a tree accepted to beta of "
                            "its depth)", choices=TREE_SHAPES,
                            essential=True, implies={"best_first": {"candidate_mode": "sampled"}})
    accept_guess: float = param(0.88, "best_first: assumed acceptance of a node's first draw (depth >= 2; adaptive: "
                                "the family's starting shape)", lo=0.01, hi=0.99)
    root_accept_guess: float = param(0.72, "best_first: assumed acceptance of the root's first draw (a step starts "
                                     "after a rejection, where drafts fail more)", lo=0.01, hi=0.99)
    sibling_accept_guess: float = param(0.25, "best_first: assumed acceptance of a later sibling once the earlier "
                                        "ones failed", lo=0.01, hi=0.99)
    relaxed: bool = param(False, "LOSSY: LANTERN relaxed acceptance (latent-proximity neighbourhoods); off = lossless",
                          paper="LANTERN: lossy, off by default", essential=True,
                          implies={True: {"candidate_mode": "topk"}})
    relaxed_k: int = param(10, "LANTERN: neighbourhood size k (nearest codes by VQ codebook latent; models without a "
                           "codebook: by image-token embedding)", lo=1, hi=1000, paper="LANTERN: k = 1000 (Anole)")
    relaxed_delta: float = param(0.1, "LANTERN: total-variation budget delta of the relaxation", lo=0.0, hi=1.0)
    drafter: str = param("", "EAGLE drafter folder; empty: eagle_drafter/ beside the model's weights",
                         folder_of="eagle", essential=True)

    def check(self) -> None:
        if self.node_budget == 1:
            raise ValueError("node_budget must be 0 (chosen from the measured costs) or at least 2 (the pending token "
                             "and a draft), got 1")
        if self.tree_shape == "best_first" and self.candidate_mode != "sampled":
            raise ValueError("tree_shape=best_first is a static tree of sampled candidates: it needs "
                             f"candidate_mode=sampled (got candidate_mode={self.candidate_mode!r})")
        if self.relaxed and self.candidate_mode != "topk":
            raise ValueError("relaxed=True (LANTERN) relaxes the acceptance of top-k candidates: it needs "
                             f"candidate_mode=topk (got candidate_mode={self.candidate_mode!r})")


# default: the fastest lossless setting measured on the demo model (an adaptive chain of sampled
# drafts, 8 nodes); preset="paper": EAGLE-2's top-k trees of 32 nodes
ADT_TREE = Method("adt_tree", "ADT-Tree", "EAGLE drafter with adjacency-adaptive dynamic draft trees (Lei et al.)",
                  ADTTreeParams, ".adt_tree.drafter:ADTTreeDrafter", drafter_kind="eagle", train="eagle:train_eagle",
                  paper_preset=(("candidate_mode", "topk"), ("node_budget", 32), ("depth", 5), ("children", 2)))
