"""Rejection sampling of drafts (docs/ARCHITECTURE.md, "Verification"): chains, sibling candidates and trees; pure, batched.

No function here reads a value back to the host, touches a model, or draws random numbers: the
caller passes the uniforms ``u`` and the Exp(1) noise ``noise`` in, so every function is a
deterministic map that the statistical tests can drive directly.

Shapes: distributions are ``[..., V]`` (any batch dims), tokens and uniforms ``[...]``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..randomness import sample_by_race

# A residual with less mass than this is rounding noise of p == q: the draft is then accepted
# with probability 1 - O(eps), and on the (numerical) rejection we fall back to p itself.
RESIDUAL_EPS = 1e-6


def take(dist: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """dist[..., tokens] -> [...]."""
    return dist.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); p itself where that has no mass (p == q up to rounding)."""
    r = (p - q).clamp(min=0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp(min=RESIDUAL_EPS), p)


def mrs(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor, noise: torch.Tensor):
    """Modified rejection sampling. Draft ``x ~ q``, target ``p``.

    Accept with probability min(1, p(x)/q(x)) (as ``u * q(x) < p(x)``, so no division and a
    zero-probability draft is never accepted), otherwise draw from the residual. The returned
    token is distributed exactly as p. Returns ``(accepted [...] bool, token [...])``.
    """
    accepted = u * take(q, x) < take(p, x)
    fallback = sample_by_race(residual(p, q), noise)
    return accepted, torch.where(accepted, x, fallback)


def verify_chain(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor, noise: torch.Tensor,
                 enabled: torch.Tensor, forced: Optional[torch.Tensor] = None, first=None):
    """Verify draft chains left to right, all positions at once.

    p, q [B, T, V]: target and draft distribution at each draft position; x [B, T] drafts;
    enabled [B, T]: positions that may be accepted (a contiguous prefix of each row); forced
    [B, T]: structure tokens, always accepted (their p is one-hot at the token).

    Returns ``(n_accepted [B], out [B, T])``: the number of leading accepted drafts, and the MRS
    output at every position (the draft where accepted, a residual sample where not). out at
    ``n_accepted`` is the correction token after the first rejection; beyond it, out is the
    maximal coupling of the old draft with the new p (used by SCD / adaptive continuation).
    ``first = (accepted [B], token [B])`` replaces the outcome at position 0 when it was decided
    elsewhere (the sibling check of a draft tree).
    """
    # forced tokens have ids past the image vocabulary: look up a dummy code there
    x_img = x if forced is None else torch.where(forced, 0, x)
    accepted, out = mrs(p, q, x_img, u, noise)
    if forced is not None:
        accepted = accepted | forced
        out = torch.where(forced, x, out)
    if first is not None:
        accepted = torch.cat([first[0][:, None], accepted[:, 1:]], 1)
        out = torch.cat([first[1][:, None], out[:, 1:]], 1)
    ok = accepted & enabled
    n_accepted = ok.long().cumprod(-1).sum(-1)
    return n_accepted, out


def verify_candidates(p: torch.Tensor, candidates: torch.Tensor, u: torch.Tensor, noise: torch.Tensor,
                      q: Optional[torch.Tensor] = None, qs: Optional[torch.Tensor] = None,
                      valid: Optional[torch.Tensor] = None):
    """Several candidates for one position (siblings in a draft tree), tried in order.

    p [..., V] target; candidates [..., K]; u [..., K]; noise [..., V] for the final residual.
    Either ``qs`` [..., K, V]: candidate k was drawn independently from qs[k] (use each as is);
    or ``q`` [..., V]: the candidates were drawn WITHOUT replacement from q, so candidate k's
    distribution is q with the earlier candidates removed and renormalised. After rejecting
    candidate k with distribution q_k, p becomes norm(max(0, p - q_k)). ``valid`` [..., K]
    masks out absent candidates (they are skipped).

    Returns ``(index [...], token [...])``: the accepted candidate's index, or -1 with a token
    drawn from the last residual when all were rejected. The token is distributed as p.
    """
    K = candidates.shape[-1]
    if (q is None) == (qs is None):
        raise ValueError("pass exactly one of q (without replacement) or qs (independent candidates)")
    r = p
    q_cur = q
    index = torch.full(candidates.shape[:-1], -1, dtype=torch.long, device=p.device)
    token = torch.zeros_like(index)
    open_ = torch.ones_like(index, dtype=torch.bool)  # no candidate accepted yet
    for k in range(K):
        x = candidates[..., k]
        q_k = qs[..., k, :] if qs is not None else q_cur
        live = open_ if valid is None else open_ & valid[..., k]
        acc = live & (u[..., k] * take(q_k, x) < take(r, x))
        index = torch.where(acc, k, index)
        token = torch.where(acc, x, token)
        open_ = open_ & ~acc
        # rejected (and live): move to the residual; absent candidates leave r unchanged
        rej = (live & ~acc).unsqueeze(-1)
        r = torch.where(rej, residual(r, q_k), r)
        if q_cur is not None:
            q_next = q_cur.scatter(-1, x.unsqueeze(-1), 0.0)
            q_next = q_next / q_next.sum(-1, keepdim=True).clamp(min=1e-30)
            q_cur = torch.where(rej, q_next, q_cur)
    token = torch.where(open_, sample_by_race(r, noise), token)
    return index, token


def tree_children(parents: torch.Tensor, valid: torch.Tensor, max_children: int) -> torch.Tensor:
    """children [B, N, K]: the first K valid children of every node in node-index order (-1: none).
    parents [B, N] (-1: child of the committed prefix), valid [B, N]."""
    B, N = parents.shape
    j = torch.arange(N, device=parents.device)
    is_child = (parents[:, None, :] == j[None, :, None]) & valid[:, None, :]  # [B, node, j]
    key = torch.where(is_child, N - j, 0)  # earlier children first
    vals, idx = key.topk(min(max_children, N), dim=-1)
    return torch.where(vals > 0, idx, -1)


def walk_tree(parents: torch.Tensor, valid: torch.Tensor, max_depth: int, max_children: int, choose):
    """The walk of a tree rule, root (node 0) down, one depth at a time. ``choose(d, cur, children, present)``
    (children [B, K] of each row's current node, present [B, K]) -> (the accepted child's index or -1, and
    the token to commit where none is, or None); the accepted child becomes the current node. Returns
    ``(n_accepted [B], path [B, D + 1], last node [B], pending [B], accepted down to depth D [B])``."""
    B, dev = parents.shape[0], parents.device
    rows = torch.arange(B, device=dev)
    kids = tree_children(parents, valid, max_children)  # [B, N, K]
    cur, n_acc, pending = (torch.zeros(B, dtype=torch.long, device=dev) for _ in range(3))
    path = torch.zeros(B, max_depth + 1, dtype=torch.long, device=dev)
    open_ = torch.ones(B, dtype=torch.bool, device=dev)
    for d in range(max_depth):
        c = kids[rows, cur]  # [B, K]
        present = c >= 0
        cc = c.clamp(min=0)
        idx, tok = choose(d, cur, cc, present)
        acc = open_ & (idx >= 0)
        child = cc.gather(1, idx.clamp(min=0)[:, None]).squeeze(1)
        if tok is not None:
            pending = torch.where(open_ & ~acc, tok, pending)
        cur = torch.where(acc, child, cur)
        path[:, d + 1] = torch.where(acc, child, 0)
        n_acc = n_acc + acc.long()
        open_ = acc
    return n_acc, path, cur, pending, open_


def verify_tree(p: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor, valid: torch.Tensor,
                forced: torch.Tensor, u: torch.Tensor, noise: torch.Tensor, max_depth: int, max_children: int,
                without_replacement: bool = False, siblings=None):
    """Verify a draft tree per row, root (node 0, the pending token) down, one depth at a time.

    p [B, N, V]: target of the position after each node; tokens [B, N]; parents [B, N]; q [B, N, V]:
    the distribution each node's token was drawn from; valid [B, N]; forced [B, N]: the node sits
    at a structure position (its token is forced and always accepted); u [B, D, K] and noise
    [B, D + 1, V] with D = max_depth, K = max_children.

    At each depth the children of the current node are siblings: `verify_candidates` tries them in
    order (independent candidates with their own q, or without replacement from one q). The
    first accepted child becomes the current node; if none is (or there are none) the residual
    sample is the next pending token; a row that accepts down to depth D takes a fresh sample of
    the deepest node's p. Returns ``(n_accepted [B], path [B, D + 1], pending [B])``; path holds
    the accepted nodes root first (entries past ``n_accepted`` are 0). ``siblings(p, candidates,
    u, noise, qs, valid) -> (index, token)`` replaces the lossless rule at every depth (only for
    an explicitly lossy option: LANTERN's relaxed acceptance)."""
    B, N, V = p.shape
    rows = torch.arange(B, device=p.device)

    def choose(d, cur, cc, present):
        cand = tokens.gather(1, cc).clamp(0, V - 1)  # structure ids are past the image vocabulary
        p_cur = p[rows, cur]
        if siblings is not None:  # another acceptance rule for a node's children (LANTERN's relaxed one)
            idx, tok = siblings(p_cur, cand, u[:, d], noise[:, d], q[rows[:, None], cc], present)
        elif without_replacement:
            idx, tok = verify_candidates(p_cur, cand, u[:, d], noise[:, d], q=q[rows, cc[:, 0]], valid=present)
        else:
            idx, tok = verify_candidates(p_cur, cand, u[:, d], noise[:, d], qs=q[rows[:, None], cc], valid=present)
        at_forced = forced.gather(1, cc[:, :1]).squeeze(1) & present[:, 0]
        return torch.where(at_forced, 0, idx), tok

    n_acc, path, cur, pending, open_ = walk_tree(parents, valid, max_depth, max_children, choose)
    bonus = sample_by_race(p[rows, cur], noise[:, max_depth])
    return n_acc, path, torch.where(open_, bonus, pending)
