"""ADT-Tree (Lei et al.): an EAGLE drafter (samplers/drafters/eagle/) with adjacency-adaptive
dynamic draft trees.

- params.py: the typed parameters, the adaptation's ranges and the Method
- sampled.py: sampled trees (children drawn without replacement, slots allocated before drawing)
- drafter.py: the drafter (EAGLE-2 top-k trees, the adaptation of depth and width, verification)
"""
from .params import ADT_TREE, ADTTreeParams

__all__ = ["ADT_TREE", "ADTTreeParams"]
