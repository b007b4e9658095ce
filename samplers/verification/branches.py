"""SJD-PAC's proactive branches in a chain step (`DraftChain.branch_depth` = D > 0): the K - 1 branches' first tokens
are d_1's siblings, so depth 1 is decided among all K candidates first (rejection sampling without replacement, or
agreement); the chain step then verifies the winner's line, and acceptance on a branch stops at its D nodes."""
from __future__ import annotations

import torch

from ..randomness import race_keys
from .agreement import agree_candidates
from .rejection import verify_candidates


def depth_one_winner(state, chain, p_all: torch.Tensor, forced: torch.Tensor, gumbel=None, noise=None,
                     q=None) -> tuple:
    """Depth 1 among the chain's draft and the branches' first tokens: by agreement with `gumbel` (the position
    noise after the pending token), else by rejection sampling with `noise` and q (the depth-1 q), drawing its
    uniforms now. Returns the winner k_star [B] (0: the chain's draft, k >= 1: branch k, -1: none), the line [B, T]
    verification continues on (the chain, or branch k_star's slots then the chain's) and, by rejection, the depth-1
    token [B] (the winner's, or the residual sample; None by agreement)."""
    cands, valid = _siblings(state, chain)
    if state.ctx.reproducible:
        k_star, token = agree_candidates(race_keys(p_all[:, 0], gumbel), cands, valid), None
    else:
        k_star, token = verify_candidates(p_all[:, 0], cands, state.draws.rand((state.ctx.batch, cands.shape[1])),
                                          noise, q=q, valid=valid)
    return (*_winner(chain, k_star, forced), token)


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
