"""AR, the baseline: one token per forward, a sample of the target's p (the Jacobi drafter with an
empty window)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...model_loaders.contract import ForwardOutput
from .base import DraftTree, LoopState, Verdict
from .jacobi import JacobiDrafter, JacobiParams
from .params import Method, StepCost


@dataclass(frozen=True)
class ARParams(JacobiParams):
    """AR: one slot, the pending token, no drafts."""


class ARDrafter(JacobiDrafter):
    """AR: the pending token's forward gives the next token, a sample of its p. The Jacobi step with
    an empty window reduced to that (nothing to verify, re-draft or record): the same draws in the
    same order, so the same tokens, with a fraction of the ops. AR's step is mostly overhead on a
    CPU, and it is the baseline every speed-up is measured against, so it should not carry the
    window's bookkeeping. Models with row-end tokens keep the Jacobi step: their chain also carries
    the forced token after the pending one (T = 2), which verification accepts in the same step."""

    def verify(self, state: LoopState, plan, tree: DraftTree, p_all: torch.Tensor, out: ForwardOutput) -> Verdict:
        if self.shapes[plan.window][0] > 1:
            return super().verify(state, plan, tree, p_all, out)
        pending = state.sample_at(p_all[:, 0], state.frontier + 1)
        n_acc = torch.zeros(state.batch, dtype=torch.long, device=state.device)
        return Verdict(n_accepted=n_acc, path=None, pending=pending, tokens=tree.tokens, p_path=p_all)

    def observe(self, state, plan, tree, verdict, p_all, out, previous_frontier):
        if self.shapes[plan.window][0] > 1:
            return super().observe(state, plan, tree, verdict, p_all, out, previous_frontier)
        return state.draft

AR = Method("ar", "AR (baseline)", "plain autoregressive sampling, one token per forward (the baseline)", ARParams,
            ARDrafter, step_cost=lambda p, row_codes, reports: StepCost(((1, 1.0),)))

__all__ = ["ARParams", "ARDrafter", "AR"]
