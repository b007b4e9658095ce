"""The Jacobi family (AR, SJD, SCD, SJD-PAC): one drafter over a window of drafts beyond the frontier.

- params.py: the typed parameters of each method and the help texts auto and spatial share
- drafter.py: the drafter (window shapes, propose, observe, drafting, stall restart) and the Methods
"""
from .drafter import AR, SCD, SJD, SJD_PAC, ARDrafter, JacobiDrafter, JacobiPlan, JacobiState, jacobi_step_cost
from .params import (INIT_ABOVE_PAPER, INIT_HELP, WINDOW_HELP, JacobiParams, ProactiveParams, SJDPACParams,
                     restart_param)

__all__ = ["AR", "INIT_ABOVE_PAPER", "INIT_HELP", "SCD", "SJD", "SJD_PAC", "WINDOW_HELP", "ARDrafter",
           "JacobiDrafter", "JacobiParams", "JacobiPlan", "JacobiState", "ProactiveParams", "SJDPACParams",
           "jacobi_step_cost", "restart_param"]
