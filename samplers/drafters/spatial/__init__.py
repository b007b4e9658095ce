"""Spatial speculative decoding: a Jacobi window over a 2-D band ahead of the frontier,
drafted by trained spatial heads and refined by the target (docs/SPATIAL.md).

- params.py: the typed parameters
- network.py: SpatialHeads, their files (load_heads, random_heads)
- drafter.py: SpatialDrafter (the `spatial` backend)
(its training: training/spatial.py, `python -m specar train-drafter --kind spatial`)
"""
from .drafter import SPATIAL, SpatialDrafter
from .params import SpatialParams

__all__ = ["SPATIAL", "SpatialDrafter", "SpatialParams"]
