"""ADT-Tree (Lei et al.): an EAGLE drafter with adjacency-adaptive dynamic draft trees (docs/ADT_TREE.md: the layer,
its band cache, top-k and sampled trees, the adaptation, the budget from measured costs).
`relaxed=True` (LOSSY): the proposal names LANTERN's relaxed rule.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from ....model_loaders.contract import ForwardOutput
from ...proposal import (SIBLINGS_INDEPENDENT, SIBLINGS_WITHOUT_REPLACEMENT, DraftTree, Relaxed, Verdict,
                         neighbour_table, one_hot)
from ...randomness import gumbel_top_k
from ...run_state import BEYOND_IMAGE, LoopState
from ..base import AdaptiveDrafter
from ..eagle import load_eagle
from ..hidden_states import DraftsFromHiddenStates, HiddenStates
from ...forward_costs import BudgetFromCosts, draft_seconds
from ..static_tree import best_first_shape
from .params import D_RANGE, K_RANGE, ADTTreeParams
from .sampled import ACCEPT_GUESS, NEG, SampledTrees

L_D, L_K = 1, 3  # the paper's adjustment steps (Anole)
# adaptive best_first: the acceptance guesses of the shape family, bushiest first (a flat image
# region accepts whole chains: the deepest shape is nearly a chain of node_budget - 1 drafts)
PLAN_GUESSES = (0.6, 0.72, 0.8, 0.88, 0.93, 0.96, 0.98)


@dataclass
class ADTTreeState:
    """ADT-Tree's tensors that cross steps (`LoopState.draft`)."""

    hidden: HiddenStates  # the target's hidden states by position
    d: torch.Tensor  # [B] each row's next tree depth (best_first: its shape number, 1-based)
    k: torch.Tensor  # [B] each row's next tree width
    dk_at: torch.Tensor  # [B, ext + 2, 2] (d, k) of the tree that covered each position (tree_init="above")
    band_kv: list  # the EAGLE layer's keys / values of committed positions, by position


def chain_tokens(a: float, depth: int) -> float:
    """Expected tokens of a step whose chain of `depth` drafts accepts each draft with a: 1 + a + ... + a^depth."""
    return sum(a ** i for i in range(depth + 1))


class ADTTreeDrafter(BudgetFromCosts, SampledTrees, DraftsFromHiddenStates, AdaptiveDrafter):
    # the sibling rule of sampled trees (tests plant SIBLINGS_INDEPENDENT in a subclass and check
    # that the chi-square test rejects it)
    sampled_siblings = SIBLINGS_WITHOUT_REPLACEMENT

    def __init__(self, params: ADTTreeParams, model, sampling):
        self._use_target(model, sampling)
        self.params = params
        self.tree_init = params.tree_init
        self.adaptive = params.adaptive
        self.beta = params.beta
        self.candidate_mode = params.candidate_mode
        self.children = params.children
        self.root_children = params.root_children or self.children  # 0: as every other node
        self.tree_shape = params.tree_shape
        self.lossless = not params.relaxed
        dev = model.device
        self.net = load_eagle(model, params.drafter).to(dev).float().eval()
        self.attn_band = self.net.cfg.attn_band  # committed positions the EAGLE layer attends to
        # 0: chosen from the timed EAGLE layer and target forwards (`set_costs`), then from the measured acceptance
        self._tune(params.node_budget, ACCEPT_GUESS, params)
        # LOSSY, opt-in: LANTERN's relaxed acceptance, named in every proposal
        self.relaxed = Relaxed(neighbour_table(model, params.relaxed_k).to(dev), params.relaxed_delta) \
            if params.relaxed else None

    def _set_budget(self, budget: int) -> None:
        """The trees of `budget` nodes: depth and width ranges (or best_first shapes) and the band's fresh positions."""
        params, V, dev = self.params, self.model.geometry.vocab_size, self.model.device
        self.node_budget = budget
        self.d0, self.k0 = params.depth, min(params.width, V)
        # a tree of N nodes is at most N - 1 deep (the adapters' commit assumes path width <= N)
        self.d_lo, self.d_hi = D_RANGE[0], min(params.max_depth, budget - 1)
        self.d0 = min(self.d0, budget - 1)
        if self.adaptive:
            self.d0 = min(max(self.d0, self.d_lo), self.d_hi)
            self.k_lo, self.k_hi = min(K_RANGE[0], V), min(K_RANGE[1], V)
            self.k0 = min(max(self.k0, self.k_lo), self.k_hi)
        slack = max(self.d0, self.d_hi) + 3
        self.plans = None  # tree_shape=best_first: the static shapes (one when not adaptive)
        if self.tree_shape == "best_first":
            guess = params.accept_guess
            guesses = PLAN_GUESSES if self.adaptive else (guess,)
            self.plans = [[replace(layer, alloc=layer.alloc.to(dev),
                                   order=None if layer.order is None else layer.order.to(dev))
                           for layer in best_first_shape(budget - 1, g, params.root_accept_guess,
                                                         params.sibling_accept_guess, max_depth=budget - 1)]
                          for g in guesses]
            # state.draft.d holds the row's shape number (1-based: 0 marks "no tree" in dk_at); adaptive:
            # start at the shape nearest accept_guess
            self.d0 = 1 + min(range(len(guesses)), key=lambda i: abs(guesses[i] - guess))
            self.d_lo, self.d_hi = 1, len(guesses)
            slack = max(len(plan) for plan in self.plans) + 3
        # the first budget is the widest: the sequence's layout (built before `set_costs`) keeps its slack
        self.slack = max(getattr(self, "slack", 0), slack)
        # band positions run through the layer per step (`_band_pass`): at least what one step
        # commits (the deepest tree + 1)
        self.fresh = min(self.attn_band, slack - 2)

    # -- the node budget from measured costs (node_budget=0: forward_costs.BudgetFromCosts) -----
    def _step_estimate(self, budget: int) -> tuple:
        """A step runs the band pass and one EAGLE layer call per further layer of the deepest tree the budget
        allows (its default, an adaptive chain, accepting each draft with a: 1 + a + ... + a^depth tokens per step)."""
        B, D, dev, S, A = self.batch, self.model.hidden_size, self.model.device, self.attn_band + self.d_hi, self.fresh
        R = 2 * B if self.uses_cfg else B
        feats, pos = torch.zeros(R, A, D, device=dev), torch.arange(A, device=dev).expand(R, A)
        kv, mask = self.net.new_cache(R, S, dev, torch.float32), torch.ones(R, 1, S, dtype=torch.bool, device=dev)

        def layer():  # one tree layer (`_forward_chosen`): its node through the layer, its q
            self._q(self.net(feats[:, :1], feats[:, :1], pos[:, :1], mask, kv, pos[:, :1]), B)

        def band():  # `_band_pass`'s layer work: the fresh positions' keys / values, then the root as a layer
            self.net.write_keys_values(feats[:, 1:], feats[:, 1:], pos[:, 1:], kv, pos[:, 1:])
            layer()
        key = ("adt_tree", self.params.drafter, R, A, S)
        seconds = draft_seconds(self.model, key + ("band",), band) + \
            (self.d_hi - 1) * draft_seconds(self.model, key + ("layer",), layer)
        return seconds, functools.partial(chain_tokens, depth=self.d_hi)  # this budget's depth

    # -- helpers -----------------------------------------------------------------------------
    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.net.embed_tokens(self.model, tokens).float()  # the target's, or the drafter's own table
        return torch.cat([e, e]) if self.uses_cfg else e

    # -- start -------------------------------------------------------------------------------
    def start(self, state: LoopState, first: ForwardOutput, p0: torch.Tensor) -> "ADTTreeState":
        B, dev = state.ctx.batch, state.ctx.device
        self.batch = B  # what `set_costs` times the EAGLE layer at
        # hidden.states[r, j]: the target feature whose output predicted position j (j = 0: the prompt's last)
        hidden = self._start_hidden(state, first, state.ctx.layout.ext + 2)
        # the EAGLE layer's keys / values of committed positions, by position (last column: spare).
        # One layer: position j's K/V depend on its own input (f_{j-1}, t_j, j) only, all final once
        # j is committed, so a band position computed in an earlier step is read back, never
        # recomputed; each step runs only the newest `fresh` positions (at least what one step
        # can commit: the deepest tree + 1) through the layer
        R = 2 * B if self.uses_cfg else B
        return ADTTreeState(hidden=hidden, d=torch.full((B,), self.d0, dtype=torch.long, device=dev),
                            k=torch.full((B,), self.k0, dtype=torch.long, device=dev),
                            dk_at=torch.zeros(B, state.ctx.layout.ext + 2, 2, dtype=torch.long, device=dev),
                            band_kv=self.net.new_cache(R, state.ctx.layout.ext + 3, dev, torch.float32))

    def host_hint(self, state: LoopState):
        act = state.active
        # the deepest and widest tree an active row asks for: [dmax, kmax] (`plan`)
        deepest = torch.stack([torch.where(act, state.draft.d, 0).max(), torch.where(act, state.draft.k, 0).max()])
        return torch.cat([deepest, super().host_hint(state)])  # and what `_measure` reads

    def plan(self, state: LoopState, hint: list) -> tuple:
        """(dmax, kmax): the deepest and widest tree an active row asks for, with kmax lowered to the smallest value
        that gives the same shapes and draws (each plan is one compiled graph, so a value that changes nothing must not
        make another one). topk trees use kmax as every layer's width (only capped by the vocabulary); sampled trees
        only through the expanded nodes per layer, min(kmax // children, the layer's nodes): a chain (children 1, the
        default) is the same tree for every kmax, and a best_first shape ignores kmax. Then the node budget (chosen by
        `set_costs`, then once more by `_measure`: dmax capped below it)."""
        self._measure_step(state, hint[2:], None if self.plans else  # the chain this step runs, depth capped below
                           functools.partial(chain_tokens, depth=min(hint[0], self.node_budget - 1)))
        dmax, kmax = max(hint[0], 1), max(hint[1], 1)
        if self.plans is None:
            dmax = min(dmax, self.node_budget - 1)
        if self.candidate_mode == "sampled":
            # the widest layer the tree expands: propose reads kmax only as emax = kmax // children, capped per layer
            C = self.children
            kmax = 1 if self.plans is not None else C * max(self._expanded_sizes(dmax, max(1, kmax // C)))
        return dmax, kmax, self.node_budget

    # -- propose -----------------------------------------------------------------------------
    def _band_pass(self, state: LoopState, S: int):
        """The band of the last `attn_band` committed positions in a fresh cache of S slots (slot i:
        position f - attn_band + 1 + i): the K/V of positions computed in earlier steps read from
        `band_kv`, the newest `fresh` positions run through the layer (and stored there). Returns
        (band, root feature [R, 1, D]); band = (kv, the band's mask [R, 1, S], fR [R], rows [R, 1]), what every
        tree layer's `_forward_chosen` of the step reads."""
        B, dev = state.ctx.batch, state.ctx.device
        R, W, A, rows = (2 * B if self.uses_cfg else B), self.attn_band, self.fresh, state.rows
        rrows = torch.arange(R, device=dev)[:, None]
        f = state.frontier
        fR = f.repeat(2) if self.uses_cfg else f
        kv = self.net.new_cache(R, S, dev, torch.float32)
        wpos = fR[:, None] - W + 1 + torch.arange(W, device=dev)
        band_valid = wpos >= 0
        wposc = wpos.clamp(min=0)
        old = W - A  # band slots read back
        by_pos = [c.transpose(1, 2) for c in state.draft.band_kv]  # [R, P, H, hd] views
        if old:
            for step_c, c in zip(kv, by_pos):
                step_c[:, :, :old] = c[rrows, wposc[:, :old]].transpose(1, 2)
        # the newest A positions: keys / values only, then the root (position f) through the whole layer
        npos, na = wposc[:, old:], torch.arange(old, W, device=dev)
        feats = state.draft.hidden.states[rrows, npos]
        embeds = self._embed(state.seq[rows[:, None], npos[:B]])
        if A > 1:
            self.net.write_keys_values(feats[:, :-1], embeds[:, :-1], npos[:, :-1], kv, na[:-1].expand(R, A - 1))
        mask = torch.zeros(R, 1, S, dtype=torch.bool, device=dev)
        mask[:, 0, :W] = band_valid  # the root (slot W - 1, position f >= 0) included
        g = self.net(feats[:, -1:], embeds[:, -1:], npos[:, -1:], mask, kv, na[-1:].expand(R, 1))
        dest = torch.where(band_valid[:, old:], wpos[:, old:], state.draft.band_kv[0].shape[2] - 1)
        for step_c, c in zip(kv, by_pos):
            c[rrows, dest] = step_c[:, :, old:W].transpose(1, 2)
        return (kv, mask, fR, rrows), g

    def _forward_chosen(self, B: int, d: int, tok, order, children: int, g_e, anc_e, slots, band):
        """The chosen nodes `order` [B, E] of layer d (flat indices into tok [B, E_parent, children])
        through the EAGLE layer at cache slots `slots` [E], each attending to the band (`_band_pass`)
        and to its ancestors. Returns (features [R, E, D], q [B, E, V], ancestry [R, E, S])."""
        kv, band_mask, fR, rrows = band
        R, E = fR.shape[0], order.shape[1]
        parent_slot = order // children  # index into the expanded set
        ctok = tok.flatten(1).gather(1, order)
        pR = parent_slot.repeat(2, 1) if self.uses_cfg else parent_slot
        pfeat = g_e[rrows, pR]
        anc = anc_e[rrows, pR]  # [R, E, S]
        anc[:, torch.arange(E, device=order.device), slots] = True
        npos = (fR + d)[:, None].expand(R, E)
        g = self.net(pfeat, self._embed(ctok), npos, band_mask | anc, kv, slots.expand(R, E))
        return g, self._q(g, B), anc

    def propose(self, state: LoopState, plan: tuple) -> DraftTree:
        """plan: (dmax, kmax, node budget), the deepest and widest tree an active row asks for (`host_hint`)."""
        if self.candidate_mode == "sampled":
            return self._propose_sampled(state, plan)
        B, V, dev, layout = state.ctx.batch, state.ctx.vocab_size, state.ctx.device, state.ctx.layout
        dmax, kmax = max(plan[0], 1), max(plan[1], 1)
        R, W = (2 * B if self.uses_cfg else B), self.attn_band
        f = state.frontier
        M = (dmax - 1) * kmax  # tree slots forwarded through the layer
        S = W + M
        band, g_e = self._band_pass(state, S)  # g_e [R, 1, D]: the expanded node (the root)
        q_e = self._q(g_e, B)  # [B, 1, V]
        score_e = torch.zeros(B, 1, device=dev)
        valid_e = torch.ones(B, 1, dtype=torch.bool, device=dev)
        gidx_e = torch.zeros(B, 1, dtype=torch.long, device=dev)  # global index of expanded nodes (0: root)
        anc_e = torch.zeros(R, 1, S, dtype=torch.bool, device=dev)  # tree slots each expanded node attends to
        all_tok, all_par, all_score, all_valid, all_depth = [], [], [], [], []
        n_glob = 1
        jk = torch.arange(kmax, device=dev)
        for d in range(1, dmax + 1):
            e = g_e.shape[1]
            pos_d = f + d
            forced = layout.forced[pos_d.clamp(max=layout.ext - 1)]
            kk = min(kmax, V)
            if state.ctx.reproducible:  # the best of log q + G[position]: the coupled draft first (REPRODUCIBLE.md)
                tok = gumbel_top_k(q_e, state.ctx.position_noise(pos_d)[:, None], kk)
                lq = q_e.gather(-1, tok)
            else:
                lq, tok = q_e.topk(kk, dim=-1)  # [B, e, kk]
            if kk < kmax:
                pad = kmax - kk
                lq = torch.cat([lq, lq.new_zeros(B, e, pad)], -1)
                tok = torch.cat([tok, tok.new_zeros(B, e, pad)], -1)
            ok = valid_e[:, :, None] & (jk[None, None] < state.draft.k[:, None, None]) & (lq > 0) & \
                (d <= state.draft.d)[:, None, None]
            lq = lq.clamp(min=1e-30).log()
            is_forced = (forced >= 0)[:, None, None]
            tok = torch.where(is_forced, forced[:, None, None].clamp(min=0), tok)
            ok = torch.where(is_forced, valid_e[:, :, None] & (jk == 0)[None, None] & (d <= state.draft.d)[:, None, None], ok)
            lq = torch.where(is_forced, 0.0, lq)
            ok = ok & (forced != BEYOND_IMAGE)[:, None, None]
            sc = torch.where(ok, score_e[:, :, None] + lq, NEG)
            par = gidx_e[:, :, None].expand(B, e, kmax)
            all_tok.append(tok.flatten(1))
            all_par.append(par.flatten(1))
            all_score.append(sc.flatten(1))
            all_valid.append(ok.flatten(1))
            all_depth.append(torch.full((B, e * kmax), d, device=dev))
            glob = n_glob + torch.arange(e * kmax, device=dev)
            n_glob += e * kmax
            if d == dmax:
                break
            # the top-k children (by cumulative score) are expanded next: forward them
            sflat = sc.flatten(1)
            order = torch.sort(sflat, dim=1, descending=True, stable=True).indices[:, :kmax]  # [B, kmax]
            okflat = ok.flatten(1).gather(1, order) & (jk[None] < state.draft.k[:, None])
            g_e, q_e, anc = self._forward_chosen(B, d, tok, order, kmax, g_e, anc_e, W + (d - 1) * kmax + jk, band)
            score_e = sflat.gather(1, order)
            valid_e = okflat
            gidx_e = glob[order]
            anc_e = anc
        tok, par, sc = torch.cat(all_tok, 1), torch.cat(all_par, 1), torch.cat(all_score, 1)
        ok, dep = torch.cat(all_valid, 1), torch.cat(all_depth, 1)
        N = self.node_budget
        L = tok.shape[1]
        keep = min(N - 1, L)
        sel = torch.sort(sc, dim=1, descending=True, stable=True).indices[:, :keep]
        sel = sel.sort(dim=1).values  # generation order: parents before children
        return self._assemble(state, tok, par, ok, dep, sel, keep, L, max_children=min(kmax, N - 1), dmax=dmax)

    def _assemble(self, state, tok, par, ok, dep, sel, keep, L, max_children, dmax, q_nodes=None, q_index=None):
        """The DraftTree of the generated nodes `sel` [B, keep] (global indices, generation order),
        padded to node_budget. q_nodes [B, E, V] / q_index [B, L]: sampled mode, the q each node
        was drawn from (its parent's); else one-hot q (deterministic candidates)."""
        B, V, dev, f = state.ctx.batch, state.ctx.vocab_size, state.ctx.device, state.frontier
        N = self.node_budget
        inv = torch.zeros(B, L + 1, dtype=torch.long, device=dev)  # global index -> tree index
        inv.scatter_(1, sel + 1, torch.arange(1, keep + 1, device=dev).expand(B, keep))
        s_ok = ok.gather(1, sel)
        s_tok = torch.where(s_ok, tok.gather(1, sel), 0)
        s_par = torch.where(s_ok, inv.gather(1, par.gather(1, sel)), 0)
        s_dep = torch.where(s_ok, dep.gather(1, sel), 1)
        s_qi = q_index.gather(1, sel) if q_index is not None else None
        if keep < N - 1:
            padn = N - 1 - keep
            z = torch.zeros(B, padn, dtype=torch.long, device=dev)
            s_ok = torch.cat([s_ok, z.bool()], 1)
            s_tok = torch.cat([s_tok, z], 1)
            s_par = torch.cat([s_par, z], 1)
            s_dep = torch.cat([s_dep, z + 1], 1)
            if s_qi is not None:
                s_qi = torch.cat([s_qi, z], 1)
        pending = state.seq.gather(1, f[:, None])
        tokens = torch.cat([pending, s_tok], 1)
        parents = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=dev), s_par], 1)
        depth = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), s_dep], 1)
        valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=dev), s_ok], 1)
        if q_nodes is None:
            q = one_hot(tokens.clamp(0, V - 1), V)
            siblings = SIBLINGS_INDEPENDENT
        else:
            qn = q_nodes[state.rows[:, None], s_qi]  # [B, N - 1, V]
            q = torch.cat([qn.new_zeros(B, 1, V), qn], 1)
            siblings = self.sampled_siblings
        return DraftTree(tokens=tokens, parents=parents, q=q, valid=valid, depth=depth, siblings=siblings,
                         max_children=max_children, max_depth=dmax, relaxed=self.relaxed)

    # -- observe -----------------------------------------------------------------------------
    def observe(self, state: LoopState, plan, tree: DraftTree, verdict: Verdict, p: torch.Tensor,
                out: ForwardOutput, previous_frontier: torch.Tensor) -> "ADTTreeState":
        B, dev, act, ds = state.ctx.batch, state.ctx.device, state.active, state.draft
        n_acc = torch.where(act, verdict.n_accepted, 0)
        path = verdict.path  # [B, Dmax + 1]
        width = path.shape[1]
        slot = torch.arange(width, device=dev)
        keep = (slot[None] <= n_acc[:, None]) & act[:, None]
        # target features of the accepted path: node i's hidden is position prev_f + i's, which
        # predicted position prev_f + i + 1
        tpos = previous_frontier[:, None] + 1 + slot
        spare = state.draft.hidden.spare
        tpos = torch.where(keep, tpos, spare)
        state.draft.hidden.write_path(state.rows, tpos, out, path)
        # (d, k) of this tree over the positions it covered
        cov = torch.where(keep, (previous_frontier[:, None] + slot).clamp(max=spare), spare)
        state.draft.dk_at[state.rows[:, None], cov] = torch.stack([state.draft.d, state.draft.k], -1)[:, None]
        if not self.adaptive:
            return ds
        # adjacency initialisation of the next tree, then bisection from this tree's acceptance
        d, k = state.draft.d, state.draft.k
        if self.tree_init == "above":
            up = state.frontier - state.ctx.layout.geometry.row_stride
            rec = state.draft.dk_at[state.rows, up.clamp(min=0)]
            has = (up >= 0) & (rec[:, 0] > 0)
            d, k = torch.where(has, rec[:, 0], d), torch.where(has, rec[:, 1], k)
        elif self.tree_init == "random":
            d = state.draws.randint(self.d_lo, self.d_hi + 1, (B,))
            k = state.draws.randint(self.k_lo, self.k_hi + 1, (B,))
        # best_first: alpha against the depth of the shape this step drafted (d numbers shapes)
        alpha = n_acc.float() / (tree.max_depth if self.plans is not None else state.draft.d.float())
        up_ = alpha >= self.beta
        nd = torch.where(up_, d + L_D, d - L_D).clamp(self.d_lo, self.d_hi)
        nk = torch.where(up_, k - L_K, k + L_K).clamp(self.k_lo, self.k_hi)
        ds.d, ds.k = torch.where(act, nd, ds.d), torch.where(act, nk, ds.k)
        return ds
