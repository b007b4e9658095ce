"""EAGLE (the drafter of ADT-Tree): one package for the method's trained parts.

- network.py: the EAGLE layer (`EagleNet`, `EagleConfig`, `random_eagle`)
- files.py: the model's drafter folder -> the network (`load_eagle`)
- lantern_conversion.py: LANTERN's released drafters -> our drafter files
  (`python -m specar convert-drafter`)
(its training: training/eagle.py, `python -m specar train-drafter --kind eagle`)
"""
from .files import load_eagle
from .network import EagleConfig, EagleNet, random_eagle

__all__ = ["EagleConfig", "EagleNet", "load_eagle", "random_eagle"]
