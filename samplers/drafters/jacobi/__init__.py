"""The Jacobi family (AR, SJD, SCD, SJD-PAC): one drafter over a window of drafts beyond the frontier.

- params.py: the typed parameters of each method, the help texts auto and spatial share, and the Methods
- drafter.py: the drafter (window shapes, propose, observe, drafting, stall restart)
"""
from .params import (AR, INIT_ABOVE_PAPER, INIT_HELP, SCD, SJD, SJD_PAC, WINDOW_HELP, JacobiParams, ProactiveParams,
                     SJDPACParams, restart_param)

__all__ = ["AR", "INIT_ABOVE_PAPER", "INIT_HELP", "SCD", "SJD", "SJD_PAC", "WINDOW_HELP", "JacobiParams",
           "ProactiveParams", "SJDPACParams", "restart_param"]
