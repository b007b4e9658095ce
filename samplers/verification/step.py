"""The step level: `verify`, the engine's one entry point (propose -> forward -> verify -> commit -> observe).

A proposal (`DraftTree`, `DraftChain`: samplers/proposal.py) and every node's target p -> the step's `Verdict`. The
step's randomness (the uniforms and Exp(1) noise of rejection.py's pure rules) is drawn from `state` in a fixed order
per shape, which a compiled step replays; in the "same image as AR" mode (`state.ctx.reproducible`) verification is by
agreement (agreement.py) and draws nothing."""
from __future__ import annotations

import torch

from functools import partial

from ..proposal import SIBLINGS_WITHOUT_REPLACEMENT, ChainVerdict, DraftChain, DraftTree, Verdict
from ..randomness import sample_by_race
from ..run_state import BEYOND_IMAGE, LoopState
from . import branches
from .agreement import agree_chain, agree_tree
from .rejection import verify_chain, verify_tree
from .relaxed import relaxed_candidates


def verify(state: LoopState, proposal: DraftTree, p: torch.Tensor) -> Verdict:
    """The verdict on `proposal` given every node's target p [B, N, V] (the forward's output)."""
    if isinstance(proposal, DraftChain):
        return verify_chain_step(state, proposal, p)
    return verify_tree_step(state, proposal, p)


def verify_tree_step(state: LoopState, tree: DraftTree, p: torch.Tensor) -> Verdict:
    """A tree, root (the pending token) down: the rule's draws, then `verify_tree` (with LANTERN's relaxed siblings
    where the proposal names them); by agreement `agree_tree`. Nodes at structure positions are forced, nodes past the
    image invalid."""
    B, N = tree.tokens.shape
    D, K, V = tree.max_depth, max(tree.max_children, 1), state.ctx.vocab_size
    parents = tree.parents
    if not isinstance(parents, torch.Tensor):
        parents = torch.tensor(list(parents), device=state.ctx.device).expand(B, N)
    pos = state.frontier[:, None] + tree.depth.expand(B, N)
    kind = state.ctx.layout.forced[pos.clamp(max=state.ctx.layout.ext - 1)]  # forced id, IMAGE_POSITION or BEYOND_IMAGE
    forced, valid = kind >= 0, tree.valid & (kind != BEYOND_IMAGE)
    if state.ctx.reproducible:
        n_acc, path, pending = agree_tree(p, tree.tokens, parents, valid, forced, state.ctx.position_noise(pos + 1),
                                          D, K)
    else:
        u = state.draws.rand((B, D, K))
        noise = state.noise(B, D + 1, V)
        n_acc, path, pending = verify_tree(p, tree.tokens, parents, tree.q, valid, forced, u, noise, D, K,
                                           tree.siblings == SIBLINGS_WITHOUT_REPLACEMENT,
                                           siblings=None if tree.relaxed is None else partial(relaxed_candidates, tree.relaxed))
    return Verdict(n_accepted=n_acc, path=path, pending=pending, tokens=tree.tokens.gather(1, path),
                   p_path=p[state.rows[:, None], path])


def verify_chain_step(state: LoopState, chain: DraftChain, p_all: torch.Tensor) -> ChainVerdict:
    """A chain, every position at once (`verify_chain`; by agreement `agree_chain`, the re-drafts' `mrs_out` then the
    target's sample after every line node). With proactive branches (branches.py), depth 1 first: the winner's line
    follows."""
    B, V, dev, rows = state.ctx.batch, state.ctx.vocab_size, state.ctx.device, state.rows
    T, D = chain.length, chain.branch_depth
    if T == 1:
        return _pending_only(state, chain, p_all)
    pos = state.frontier[:, None] + torch.arange(T, device=dev)
    forced = state.ctx.layout.forced[pos[:, 1:]] >= 0
    if state.ctx.reproducible:
        gumbel = state.ctx.position_noise(pos + 1)  # [B, T, V]: the position after each chain slot
        won = branches.depth_one_winner(state, chain, p_all, forced, gumbel=gumbel[:, 0]) if D else None
    else:
        noise = state.noise(B, T, V)  # noise[:, i-1] serves position frontier+i
        u = state.draws.rand((B, T - 1))
        q = chain.q[:, 1:]
        won = branches.depth_one_winner(state, chain, p_all, forced, noise=noise[:, 0], q=q[:, 0]) if D else None
    line, x_line, p, first = None, chain.tokens, p_all, None
    if won is not None:  # the winner's line; depth 1 decided (a candidate won)
        k_star, line, token = won
        x_line, p, first = chain.tokens.gather(1, line), p_all[rows[:, None], line], k_star >= 0
    if state.ctx.reproducible:
        n_acc, mrs_out = agree_chain(p, x_line[:, 1:], gumbel, chain.enabled, forced, first=first)
        noise = None
    else:  # with branches, the depth-1 outcome: the winner's token, or the residual sample after every sibling
        first = None if won is None else (first, torch.where(first, x_line[:, 1], token))
        n_acc, mrs_out = verify_chain(p[:, :-1], q, x_line[:, 1:], u, noise[:, :-1], chain.enabled, forced, first)
    if won is not None:
        n_acc = branches.cap_branch_acceptance(n_acc, k_star, D)
    n_acc = torch.where(state.active, n_acc, 0)
    n_en = chain.enabled.sum(-1)
    if state.ctx.reproducible:
        pending = mrs_out[rows, n_acc]
    else:  # the correction after a rejection, else a fresh sample of the p after the last draft
        fresh_next = sample_by_race(p[rows, n_acc], noise[rows, n_acc])
        correction = torch.cat([mrs_out, fresh_next[:, None]], 1)[rows, n_acc]
        pending = torch.where(n_acc < n_en, correction, fresh_next)
    return ChainVerdict(n_accepted=n_acc, path=line, pending=pending, tokens=x_line, p_path=p, mrs_out=mrs_out,
                        noise=noise, n_enabled=n_en)


def _pending_only(state, chain, p) -> ChainVerdict:
    """A chain with no drafts (AR): the new pending token is the target's sample of the next position, with the chain
    rule's draws (`mrs_out`: by agreement that sample, else empty: no draft to couple with)."""
    zero = torch.zeros(state.ctx.batch, dtype=torch.long, device=state.ctx.device)
    noise = None if state.ctx.reproducible else state.noise(state.ctx.batch, 1, state.ctx.vocab_size)
    pending = state.sample_at(p[:, 0], state.frontier + 1) if noise is None else sample_by_race(p[:, 0], noise[:, 0])
    return ChainVerdict(n_accepted=zero, path=None, pending=pending, tokens=chain.tokens, p_path=p,
                        mrs_out=pending[:, None] if noise is None else pending[:, None][:, :0],
                        noise=noise, n_enabled=zero)
