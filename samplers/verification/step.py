"""The step level: `verify`, the engine's one entry point (propose -> forward -> verify -> commit -> observe).

A proposal (`DraftTree`, `DraftChain`: samplers/proposal.py) and every node's target p -> the step's `Verdict`. The
step's randomness (the uniforms and Exp(1) noise of rejection.py's pure rules) is drawn from `state` in a fixed order
per shape, which a compiled step replays; in the "same image as AR" mode (`state.ctx.reproducible`) verification is by
agreement (agreement.py) and draws nothing."""
from __future__ import annotations

import torch

from functools import partial

from ..proposal import SIBLINGS_WITHOUT_REPLACEMENT, ChainVerdict, DraftChain, DraftTree, Verdict
from ..randomness import race_keys, sample_by_race
from ..run_state import BEYOND_IMAGE, LoopState
from .agreement import agree_candidates, agree_chain, agree_tree
from .rejection import verify_candidates, verify_chain, verify_tree
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
    target's sample after every line node). With branches, depth 1 first: the winner's line follows."""
    B, V, dev, rows = state.ctx.batch, state.ctx.vocab_size, state.ctx.device, state.rows
    T, D = chain.length, chain.branch_depth
    if T == 1:
        return _pending_only(state, chain, p_all)
    pos = state.frontier[:, None] + torch.arange(T, device=dev)
    forced = state.ctx.layout.forced[pos[:, 1:]] >= 0
    if state.ctx.reproducible:
        gumbel = state.ctx.position_noise(pos + 1)  # [B, T, V]: the position after each chain slot
        if D:
            k_star = agree_candidates(race_keys(p_all[:, 0], gumbel[:, 0]), *_siblings(state, chain))
    else:
        noise = state.noise(B, T, V)  # noise[:, i-1] serves position frontier+i
        u = state.draws.rand((B, T - 1))
        q = chain.q[:, 1:]
        if D:  # the chain's draft and the branches' first tokens, drawn without replacement from q
            cands, valid = _siblings(state, chain)
            k_star, token = verify_candidates(p_all[:, 0], cands, state.draws.rand((B, cands.shape[1])), noise[:, 0],
                                              q=q[:, 0], valid=valid)
    line, x_line, p, first = None, chain.tokens, p_all, None
    if D:
        k_star, line = _winner(chain, k_star, forced)
        x_line, p = chain.tokens.gather(1, line), p_all[rows[:, None], line]
        first = k_star >= 0
    if state.ctx.reproducible:
        n_acc, mrs_out = agree_chain(p, x_line[:, 1:], gumbel, chain.enabled, forced, first=first)
        noise = None
    else:
        if D:  # the depth-1 outcome: the winner's token, or the residual sample after every sibling
            first = (first, torch.where(first, x_line[:, 1], token))
        n_acc, mrs_out = verify_chain(p[:, :-1], q, x_line[:, 1:], u, noise[:, :-1], chain.enabled, forced, first)
    if D:
        n_acc = cap_branch_acceptance(n_acc, k_star, D)
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


def _siblings(state, chain):
    """[B, K] depth-1 candidates (the chain's draft, then each branch's first token) and their validity."""
    T, D = chain.length, chain.branch_depth
    cands = torch.cat([chain.tokens[:, 1:2], chain.tokens[:, T::D]], 1).clamp(0, state.ctx.vocab_size - 1)
    valid = torch.cat([torch.ones_like(chain.branch_valid[:, :1]), chain.branch_valid], 1)
    return cands, valid


def _winner(chain, k_star, forced):
    """The depth-1 winner (a structure position: the chain, as every branch holds the token) and the slot line
    verification continues on: the chain, or branch k_star's D slots then the chain's."""
    T, D = chain.length, chain.branch_depth
    k_star = torch.where(forced[:, 0], 0, k_star)
    depth = torch.arange(T, device=k_star.device)
    branch_slot = T + (k_star.clamp(min=1) - 1)[:, None] * D + depth[None] - 1
    on_branch = (k_star[:, None] >= 1) & (depth[None] >= 1) & (depth[None] <= D)
    return k_star, torch.where(on_branch, branch_slot, depth[None])


def cap_branch_acceptance(n_acc: torch.Tensor, k_star: torch.Tensor, depth: int) -> torch.Tensor:
    """When a proactive branch (k >= 1) won depth 1, its line holds only D nodes of its own: the chain's nodes after
    them were computed in the chain's context, so their outputs (the p of positions D+2, ...) and their KV are wrong for
    this branch. Acceptance stops at D; the output of branch node D (the exact p of position D+1) then yields the
    pending token: the MRS output there (a sample of that p whichever draft it verified), or a fresh sample."""
    return torch.where(k_star >= 1, n_acc.clamp(max=depth), n_acc)
