"""`auto`: SCD whose window, draft init and proactive branches are chosen every step on the host from the acceptance
seen so far and the step cost measured during the generation: params.py (the Method), window.py, cost.py, trials.py
(the host-side policies), drafter.py (`AutoDrafter`). How it chooses, and why that is lossless (each choice of step t
is a function of the steps before it): docs/ARCHITECTURE.md, "Drafters"."""
from .params import AUTO, AutoParams
from .window import _MEMORY, AutoMemory, candidate_windows

__all__ = ["AUTO", "AutoMemory", "AutoParams", "candidate_windows"]
