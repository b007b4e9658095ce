"""The decode step: propose (drafter) -> forward (model) -> verify (samplers/verification/) -> commit -> observe
(drafter), every phase on the device after the host's plan; the engine (engine.py) runs it eagerly or as one compiled
graph per plan (compiled_step/)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..model_loaders.contract import Session
from ..model_loaders.precision import batch_invariant
from .drafters.base import AdaptiveDrafter, Drafter
from .proposal import DraftTree, Verdict
from .run_state import LoopState, RunContext
from .target import invalid_rows, target_probs
from .verification.step import verify


@dataclass
class StepLog:
    """One generation's host values besides the loop's tensors: its drafter, clock and per-step log."""

    drafter: Drafter
    adaptive: Optional[AdaptiveDrafter]  # the drafter when it is adaptive (checked once, by the engine), else None
    sync: Callable[[], None]  # waits for the device (CUDA), else nothing
    timed: bool  # eager forwards timed apart from the rest of the step (CPU, or profile)
    forward_s: float = 0.0  # seconds inside model forwards (when timed)
    hint: object = None  # the drafter's value from the last host read (`HostHint`)
    committed: list = field(default_factory=list)  # per step: [B] tokens each row settled
    active: list = field(default_factory=list)  # per step: [B] rows that took part


def decode_step(log: StepLog, plan, state: LoopState, session: Session, at_step: torch.Tensor):
    """One decode step after its plan, every phase on the device: propose -> forward -> target -> verify -> commit ->
    observe. No host read, no shape that depends on a value: with compile=True it runs as one graph per plan. It writes
    the loop's tensors (`state`: seq, frontier, the drafter's state), the session's cache and `at_step`; returns
    (bad-logits flag, [B] tokens each row settled, [B] rows that took part)."""
    drafter, active = log.drafter, state.active
    tree = drafter.propose(state, plan)
    out, p = forward(log, session, state.ctx, tree)
    verdict = verify(state, tree, p)
    previous = state.frontier
    bad, committed = commit(session, state, verdict, at_step)
    state.draft = drafter.observe(state, plan, tree, verdict, p, out, previous)
    state.active = state.frontier < state.ctx.layout.last_img
    return bad, committed, active


def forward(log: StepLog, session: Session, ctx: RunContext, tree: DraftTree):
    """The model's forward of the tree and every node's target p (the next position's)."""
    if log.timed:  # eager only: the forward's share of the step (compiled, the step is one graph)
        log.sync()
        tf = time.perf_counter()
    width = ctx.same_image.pin_width
    with ctx.same_image.mode():
        if width is None:
            out = ctx.model.forward(session, tree.tokens, tree.parents)
        else:
            out = batch_invariant.pinned_forward(ctx.model, session, tree.tokens, tree.parents, width)
    if log.timed:
        log.sync()
        log.forward_s += time.perf_counter() - tf
    return out, target_probs(out.cond, out.uncond, ctx.sampling)

def commit(session: Session, state: LoopState, verdict: Verdict, at_step):
    """Write the accepted drafts and the new pending token, keep the accepted path's KV, move the frontier. Returns a
    flag (a committed position's target was not a distribution) and the tokens each row settled."""
    active, frontier, model = state.active, state.frontier, state.ctx.model
    n_acc = torch.where(active, verdict.n_accepted, 0)
    width = verdict.tokens.shape[1]
    slot = torch.arange(width, device=state.ctx.device)
    new_f = frontier + n_acc + 1
    tpos = frontier[:, None] + 1 + slot  # positions of p_path's targets
    newly = (slot[None] <= n_acc[:, None]) & active[:, None]
    state.write_tokens(tpos[:, :-1], newly[:, :-1], verdict.tokens[:, 1:])  # accepted drafts
    forced_next = state.ctx.layout.forced[new_f]
    pending = torch.where(forced_next >= 0, forced_next, verdict.pending)
    state.write_tokens(new_f[:, None], active[:, None], pending[:, None])
    r = state.rows[:, None].expand_as(tpos)
    state.step_count = state.step_count + 1
    at_step[r, torch.where(newly, tpos, state.spare)] = state.step_count
    model.commit(session, verdict.path, torch.where(active, n_acc + 1, 0))
    committed = torch.where(active, new_f.clamp(max=model.geometry.seq_len - 1) - frontier, 0)
    state.frontier = torch.where(active, new_f, frontier)
    return (invalid_rows(verdict.p_path) & newly).any(), committed
