"""Hawk (Chen et al.): spatial draft heads with a speculation cache, one package for the method.

- params.py: the typed parameters
- network.py: the heads and their files (`HawkConfig`, `HawkHeads`, `load_heads`, `random_heads`)
- drafter.py: the tree topology and the drafter
(its training: training/hawk.py, `python -m specar train-drafter --kind hawk`)
"""
from .drafter import HAWK, HawkDrafter, tree_topology
from .network import HawkConfig, HawkHeads, load_heads, random_heads
from .params import HawkParams

__all__ = ["HAWK", "HawkConfig", "HawkDrafter", "HawkHeads", "HawkParams", "load_heads", "random_heads",
           "tree_topology"]
