"""ADT-Tree (Lei et al.): an EAGLE drafter (samplers/drafters/eagle/) with adjacency-adaptive
dynamic draft trees.

- params.py: the typed parameters and the adaptation's ranges
- sampled.py: sampled trees (children drawn without replacement, slots allocated before drawing)
- drafter.py: the drafter (EAGLE-2 top-k trees, the adaptation of depth and width, verification)
"""
from .drafter import ADT_TREE, ADTTreeDrafter
from .params import ADTTreeParams

__all__ = ["ADT_TREE", "ADTTreeDrafter", "ADTTreeParams"]
