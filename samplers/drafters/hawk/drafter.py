"""Hawk (Chen et al.): spatial draft heads (horizontal + vertical) with a speculation cache (docs/HAWK.md: the heads,
q, the cache, the pool, the tree, the budget from measured costs).

Exactness: every draft is SAMPLED from its pool q, which depends only on committed hidden states, never on the
speculative tokens above it: verification is the plain tree rule with independent siblings (the paper's appendix A).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional

import torch

from ....model_loaders.contract import ForwardOutput
from ...proposal import DraftTree, Verdict
from ...randomness import gumbel_top_k, sample_by_race
from ...run_state import LoopState
from ..base import AdaptiveDrafter
from ..hidden_states import DraftsFromHiddenStates, HiddenStates
from ...forward_costs import BudgetFromCosts, draft_seconds
from .network import load_heads
from .params import HawkParams

SLOT_ACCEPT = 0.6  # prior acceptance of child slot 0; slot m: SLOT_ACCEPT * SLOT_DECAY ** m
SLOT_DECAY = 0.6


def tree_topology(budget: int, width: int, depth: int, prior: float = SLOT_ACCEPT):
    """(parents, slots, depths) of the best `budget - 1` draft nodes (plus the root) of the
    Cartesian product tree with `width` child slots per node and `depth` levels, by the prior
    path score prod prior * SLOT_DECAY ** slot. Nodes sorted by depth then generation order
    (siblings by slot), so node indices respect parents."""
    chosen = []  # (depth, key path, parent key)
    heap = [(-prior * SLOT_DECAY ** m, (m,)) for m in range(width)] if depth >= 1 else []
    heapq.heapify(heap)
    while heap and len(chosen) < budget - 1:
        neg, key = heapq.heappop(heap)
        chosen.append(key)
        if len(key) < depth:
            for m in range(width):
                heapq.heappush(heap, (neg * prior * SLOT_DECAY ** m, key + (m,)))
    chosen.sort(key=lambda k: (len(k), k))
    index = {(): 0}
    parents, slots, depths = [-1], [0], [0]
    for i, key in enumerate(chosen, 1):
        index[key] = i
        parents.append(index[key[:-1]])
        slots.append(key[-1])
        depths.append(len(key))
    return parents, slots, depths


@dataclass
class HawkTree(DraftTree):
    """A Hawk step's tree and the pool source of each node (0: horizontal, d: vertical depth d; -1: invalid)."""

    source: Optional[torch.Tensor] = None  # [B, N]


class HawkDrafter(BudgetFromCosts, DraftsFromHiddenStates, AdaptiveDrafter):
    def __init__(self, params: HawkParams, model, sampling):
        self._use_target(model, sampling)
        self.n = params.horizontal_heads
        self.v = params.vertical_depth
        # positions past the horizontal heads drafted from the vertical cache alone (0: the paper's tree)
        self.reach = params.vertical_reach if self.v else 0
        self.prior = params.chain_prior
        self.L = self.n + self.reach  # deepest tree level
        self.c = params.candidates
        self.S = 1 + self.v  # pool sources per position: horizontal, vertical 1..v
        self.W = self.c * self.S  # child slots per node
        self.heads = load_heads(model, self.n, self.v, params.heads).to(model.device).float().eval()
        self._tune(params.node_budget, self.prior, params)  # 0: from the timed heads and target forwards (`set_costs`)
        self.slack = self.L + 3
        self.stride = model.geometry.row_stride

    def _set_budget(self, budget: int) -> None:
        """The tree of `budget` nodes (fixed for the generation)."""
        dev = self.model.device
        self.node_budget = budget
        parents, slots, depths = tree_topology(budget, self.W, self.L, self.prior)
        self.parents = parents + [0] * (budget - len(parents))  # pad: invalid children of the root
        self.n_real = len(parents)
        self.slot_of = torch.tensor(slots + [0] * (budget - len(parents)), device=dev)
        self.depth = torch.tensor(depths + [1] * (budget - len(parents)), device=dev)
        self.parent_of = torch.tensor([0] + self.parents[1:], device=dev)  # the root: itself
        self.max_depth = max(depths)
        self.max_children = max(sum(1 for q in parents if q == i) for i in range(len(parents)))

    # -- the node budget from measured costs (node_budget=0: forward_costs.BudgetFromCosts) -----
    def _step_estimate(self, budget: int) -> tuple:
        """The heads run once per step whatever the budget; the tree's expected tokens at acceptance a (a node's
        child slot m accepted with a (1 - a) ** m)."""
        B, D = self.batch, self.model.hidden_size
        feats = torch.zeros(2 * B if self.uses_cfg else B, self.n + self.L * self.v, D, device=self.model.device)

        def heads():  # propose's network: the heads on the rows' hidden states, then their q
            h = [self.heads.horizontal(feats[:, 0])]
            if self.v:
                h.append(self.heads.vertical(feats[:, self.n:].unflatten(1, (self.L, self.v))).flatten(1, 2))
            self._q(torch.cat(h, 1), B)

        def tokens(a, nodes=list(zip(self.parents[1:self.n_real], self.slot_of.tolist()[1:self.n_real]))):  # its tree
            reach = [1.0]
            for q, m in nodes:
                reach.append(reach[q] * a * (1 - a) ** m)
            return sum(reach)
        return draft_seconds(self.model, ("hawk", self.n, self.v, self.L, feats.shape[0]), heads), tokens

    # -- helpers -----------------------------------------------------------------------------
    def _recorded_q(self, pool_q: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """The q recorded for each node: the pool entry its token was drawn from.
        pool_q [B, N, S, V], source [B, N] -> [B, N, V]."""
        B, N, S, V = pool_q.shape
        return pool_q.gather(2, source[:, :, None, None].expand(B, N, 1, V)).squeeze(2)

    # -- start -------------------------------------------------------------------------------
    def start(self, state: LoopState, first: ForwardOutput, p0: torch.Tensor) -> HiddenStates:
        """The drafter's state: the store of the target's hidden states by position."""
        self.batch = state.ctx.batch  # what `set_costs` times the heads at
        return self._start_hidden(state, first, state.ctx.layout.ext + 3)

    # -- propose -----------------------------------------------------------------------------
    def propose(self, state: LoopState, plan=None) -> "HawkTree":
        B, V, dev, layout = state.ctx.batch, state.ctx.vocab_size, state.ctx.device, state.ctx.layout
        n, v, S, N, L = self.n, self.v, self.S, self.node_budget, self.L
        f = state.frontier
        hid = state.draft.states
        top = hid.shape[1] - 2
        rowsR = torch.arange(hid.shape[0], device=dev)
        fR = f.repeat(2) if self.uses_cfg else f
        k = torch.arange(1, L + 1, device=dev)
        # horizontal: heads on h_{f-1} (index f) for levels 1..n; levels n+1..L have none
        hh = hid[rowsR, fR.clamp(max=top)]  # [R, D]
        feats = [self.heads.horizontal(hh)]  # [R, n, D]
        avail = [(k <= n)[None, :, None].expand(B, L, 1)]
        if v:
            d = torch.arange(1, v + 1, device=dev)
            P = f[:, None] + k  # [B, L]
            src = P[:, :, None] - 1 - d * self.stride  # [B, L, v] source positions
            ok = (src >= -1) & (src <= f[:, None, None] - 1)
            srcR = (src.repeat(2, 1, 1) if self.uses_cfg else src).clamp(min=-1) + 1
            hv = hid[rowsR[:, None, None], srcR.clamp(max=top)]  # [R, L, v, D]
            feats.append(self.heads.vertical(hv).flatten(1, 2))  # [R, L * v, D]
            avail.append(ok)
        q_all = self._q(torch.cat(feats, 1), B)  # one pass through the image head: [B, n + L * v, V]
        qh = q_all[:, :n, None]  # [B, n, 1, V]
        if L > n:
            qh = torch.cat([qh, qh[:, :1].expand(B, L - n, 1, V)], 1)  # placeholders, never drawn
        pool = [qh] + ([q_all[:, n:].view(B, L, v, V)] if v else [])
        pool_q = torch.cat(pool, 2)  # [B, L, S, V]
        avail = torch.cat(avail, 2)  # [B, L, S]
        # pairs (sample r, source s), r-major; the available ones first (stable)
        pair_ok = avail.repeat(1, 1, self.c)  # [B, n, c * S]: pair m -> source m % S
        order = torch.sort((~pair_ok).to(torch.int8), dim=-1, stable=True).indices
        n_ok = pair_ok.sum(-1)  # [B, n]
        # nodes
        depth = self.depth  # [N]
        kk = (depth - 1).clamp(min=0)
        slot = self.slot_of
        pair = order[:, kk, slot]  # [B, N]
        source = pair % S
        valid = slot[None] < n_ok[:, kk]
        valid[:, 0] = True
        valid[:, self.n_real:] = False
        node_q = self._recorded_q(pool_q[:, kk], source)  # [B, N, V]
        draw_q = pool_q[:, kk].gather(2, source[:, :, None, None].expand(B, N, 1, V)).squeeze(2)
        pos = (f[:, None] + depth).clamp(max=layout.ext - 1)
        if state.ctx.reproducible:  # sample r of a source: the (r+1)-th best of log q + G[position] (w/o replacement)
            ranked = gumbel_top_k(draw_q, state.ctx.position_noise(pos), min(self.c, V))
            tokens = ranked.gather(2, (pair // S).clamp(max=ranked.shape[2] - 1)[:, :, None]).squeeze(2)
        else:
            tokens = sample_by_race(draw_q, state.noise(B, N, V))
        forced = layout.forced[pos]
        at_forced = forced >= 0
        tokens = torch.where(at_forced, forced, tokens)
        # a forced position: the structure token as the single child (slot 0)
        valid = (valid | (at_forced & (slot[None] == 0))) & (~at_forced | (slot[None] == 0))
        tokens[:, 0] = state.seq[state.rows, f.clamp(max=state.seq.shape[1] - 2)]
        for _ in range(self.max_depth - 1):  # a node under an invalid parent is invalid (one level per pass)
            valid = valid & valid[:, self.parent_of]
        tokens = torch.where(valid, tokens, 0)
        return HawkTree(tokens=tokens, parents=self.parents, q=node_q, valid=valid, depth=self.depth,
                        max_children=self.max_children, max_depth=self.max_depth,
                        source=torch.where(valid, source, -1))

    # -- observe -----------------------------------------------------------------------------
    def observe(self, state: LoopState, plan, tree: "HawkTree", verdict: Verdict, p: torch.Tensor,
                out: ForwardOutput, previous_frontier: torch.Tensor) -> HiddenStates:
        dev, act = state.ctx.device, state.active
        n_acc = torch.where(act, verdict.n_accepted, 0)
        path = verdict.path
        width = path.shape[1]
        slot = torch.arange(width, device=dev)
        keep = (slot[None] <= n_acc[:, None]) & act[:, None]
        hidden = state.draft
        spare = hidden.spare
        # node path[t] sits at position prev_f + t: its hidden state goes to index prev_f + t + 1
        tpos = torch.where(keep, (previous_frontier[:, None] + 1 + slot).clamp(max=spare), spare)
        hidden.write_path(state.rows, tpos, out, path)
        return hidden


__all__ = ["HawkDrafter", "tree_topology"]
