"""LANTERN relaxed acceptance (Jang et al.): LOSSY, off by default (`relaxed=True` on adt_tree).

Image tokens whose codebook latents are close are nearly interchangeable, so LANTERN accepts a draft x against a relaxed
target: p with the mass of x's latent neighbours moved onto x. The neighbourhood A(x) is x's `k` nearest codes
(`proposal.neighbour_table`), taken in order of proximity while the moved mass stays within the TV budget `delta`:

    p~(x) = p(x) + sum_{y in A} p(y),   p~(y) = 0 for y in A,   TV(p, p~) = sum_{y in A} p(y) <= delta.

Verification is then ordinary speculative sampling against p~ (accept x with min(1, p~(x)/q(x)), else the residual of
p~), so every position is drawn from a distribution within delta of p. With several siblings the budget is shared: a
later sibling is only reached with the probability that the earlier ones were rejected, and moves at most the budget
left divided by that probability, so the position's output distribution stays within `delta` of the exact target (given
the accepted prefix). Over n sampled positions the image is within 1 - (1 - delta)^n <= n delta of exact AR in total
variation. delta = 0 is exact.
"""
from __future__ import annotations

import torch

from ..proposal import Relaxed
from ..randomness import sample_by_race
from .rejection import residual, take


def relax(r: torch.Tensor, x: torch.Tensor, neighbours: torch.Tensor, allowed: torch.Tensor):
    """r [..., V], x [...], allowed [...] (mass that may move): (p~, moved mass)."""
    nb = neighbours[x]  # [..., k]
    m = r.gather(-1, nb)
    inc = m.cumsum(-1) <= allowed[..., None]  # proximity order, within the budget
    moved = (m * inc).sum(-1)
    rt = r.scatter(-1, nb, torch.where(inc, 0.0, m))
    rt = rt.scatter_add(-1, x[..., None], moved[..., None])
    return rt, moved


def relaxed_candidates(rule: Relaxed, p, candidates, u, noise, qs, valid):
    """`verify_candidates` (independent siblings) against `rule`'s relaxed targets (`DraftTree.relaxed`); one budget."""
    K = candidates.shape[-1]
    r = p
    index = torch.full(candidates.shape[:-1], -1, dtype=torch.long, device=p.device)
    token = torch.zeros_like(index)
    open_ = torch.ones_like(index, dtype=torch.bool)
    budget = torch.full(index.shape, float(rule.delta), device=p.device)  # absolute TV left at this position
    reach = torch.ones(index.shape, device=p.device)  # probability of reaching this candidate
    for k in range(K):
        x = candidates[..., k]
        q_k = qs[..., k, :]
        live = open_ & valid[..., k]
        rt, moved = relax(r, x, rule.neighbours, budget / reach.clamp(min=1e-12))
        acc_p = take(rt, x)
        acc = live & (u[..., k] * take(q_k, x) < acc_p)
        index = torch.where(acc, k, index)
        token = torch.where(acc, x, token)
        open_ = open_ & ~acc
        rej = live & ~acc
        budget = torch.where(live, (budget - reach * moved).clamp(min=0), budget)
        accept_prob = torch.minimum(acc_p / take(q_k, x).clamp(min=1e-30), torch.ones_like(acc_p))
        reach = torch.where(live, reach * (1 - accept_prob), reach)
        r = torch.where(rej.unsqueeze(-1), residual(rt, q_k), r)
    token = torch.where(open_, sample_by_race(r, noise), token)
    return index, token
