"""Hawk (Chen et al.): spatial draft heads with a speculation cache, one package for the method.

- params.py: the typed parameters and the Method
- network.py: the heads and their files (`HawkConfig`, `HawkHeads`, `load_heads`, `random_heads`)
- drafter.py: the tree topology and the drafter
(its training: training/hawk.py, `python -m specar train-drafter --kind hawk`)
"""
from .params import HAWK, HawkParams

__all__ = ["HAWK", "HawkParams"]
