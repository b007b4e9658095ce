"""Verification by agreement: the "same image as AR" mode (docs/REPRODUCIBLE.md). Pure, batched.

The target's own sample of a position is argmax(log p + G), G the position's noise (randomness.PositionNoise: a function
of seed, image row and absolute position only), exactly what plain AR draws there. A draft is accepted only where it IS
that sample, and the pending token is the target's sample after the last accepted node, so the committed tokens are AR's
whatever was drafted. The same keys draw coupled drafts.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..randomness import race_keys
from .rejection import tree_children


def agreeing(tokens: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """tokens [..., K] that equal the target's sample argmax(keys) (keys [..., V]) -> bool [..., K]."""
    return tokens == keys.argmax(-1, keepdim=True)


def first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim, -1 where there is none."""
    return torch.where(mask.any(-1), mask.to(torch.uint8).argmax(-1), -1)


def agree_candidates(keys: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The first valid candidate [..., K] that is the target's sample (keys [..., V]), else -1."""
    return first_true(valid & agreeing(candidates, keys))


def agree_chain(p: torch.Tensor, x: torch.Tensor, gumbel: torch.Tensor, enabled: torch.Tensor,
                forced: Optional[torch.Tensor] = None, first: Optional[torch.Tensor] = None):
    """Verify draft chains by agreement, all positions at once.

    p [B, T, V]: target of the position after each chain node (node 0: the pending token); x [B, T - 1]: the drafts of
    nodes 1..T-1; gumbel [B, T, V]: the noise of the position after each node; enabled [B, T - 1]; forced [B, T - 1]:
    structure tokens, always accepted; ``first`` [B]: the outcome of node 1 when it was decided elsewhere (a sibling
    check).

    Returns ``(n_accepted [B], samples [B, T])``: the leading drafts equal to the target's sample, and the target's
    sample after every node; the new pending token is ``samples[b, n_accepted]``.
    """
    keys = race_keys(p, gumbel)
    accepted = agreeing(x.unsqueeze(-1), keys[:, :-1]).squeeze(-1)
    if forced is not None:
        accepted = accepted | forced
    if first is not None:
        accepted = torch.cat([first[:, None], accepted[:, 1:]], 1)
    n_accepted = (accepted & enabled).long().cumprod(-1).sum(-1)
    return n_accepted, keys.argmax(-1)


def agree_tree(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor,
               forced: torch.Tensor, gumbel: torch.Tensor, max_depth: int, max_children: int):
    """`verify_tree` by agreement: from the root (node 0, the pending token) down, the first valid child equal to the
    target's sample after the current node (or at a structure position, where every child holds the forced token)
    becomes the current node; padded nodes never agree.

    p [B, N, V], tokens [B, N], parents [B, N], valid [B, N], forced [B, N] as in `verify_tree`; gumbel [B, N, V]: the
    noise of the position after each node. Returns ``(n_accepted [B], path [B, D + 1], pending [B])`` like
    `verify_tree`; pending is the target's sample after the last accepted node (whether no child agreed there or the
    tree ended)."""
    B = tokens.shape[0]
    rows = torch.arange(B, device=p.device)
    keys = race_keys(p, gumbel)  # [B, N, V]: argmax is the target's sample after each node
    # every node's agreeing child at once (the walk then only follows them: no per-depth work over V)
    kids = tree_children(parents, valid, max_children)  # [B, N, K]
    cc = kids.clamp(min=0).flatten(1)
    match = agreeing(tokens.gather(1, cc).view(kids.shape), keys) | forced.gather(1, cc).view(kids.shape)
    first = first_true((kids >= 0) & match)
    agreeing_child = torch.where(first >= 0, kids.gather(2, first.clamp(min=0)[..., None]).squeeze(2), -1)
    path = torch.zeros(B, max_depth + 1, dtype=torch.long, device=p.device)
    cur = path[:, 0].clone()
    for d in range(max_depth):  # a row with no agreeing child stays where it is: -1 again at every later depth
        child = agreeing_child[rows, cur]
        path[:, d + 1] = child.clamp(min=0)
        cur = torch.where(child >= 0, child, cur)
    return (path[:, 1:] > 0).sum(1), path, keys[rows, cur].argmax(-1)
