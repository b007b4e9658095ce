"""Spatial speculative decoding (docs/SPATIAL.md): params.py (the Method), network.py (SpatialHeads and their files),
drafter.py (`SpatialDrafter`); its training: training/spatial.py."""
from .params import SPATIAL, SpatialParams

__all__ = ["SPATIAL", "SpatialParams"]
