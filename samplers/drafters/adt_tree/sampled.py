"""ADT-Tree's sampled trees (`candidate_mode="sampled"`): children drawn without replacement from
the drafter's q, the slots allocated before drawing (see `SampledTrees._propose_sampled`)."""
from __future__ import annotations

import math

import torch

from ...proposal import DraftTree
from ...run_state import BEYOND_IMAGE, LoopState

NEG = -1e30  # score of an absent candidate
ACCEPT_GUESS = 0.8  # sampled mode: assumed acceptance of a node's first draw (orders the expansion)
LOG_A, LOG_1MA = math.log(ACCEPT_GUESS), math.log(1 - ACCEPT_GUESS)


class SampledTrees:
    """The sampled-tree proposal of `ADTTreeDrafter` (a mixin: it reads the drafter's state)."""

    def _propose_sampled(self, state: LoopState, plan: tuple) -> DraftTree:
        """candidate_mode="sampled": every expanded node draws `children` siblings WITHOUT replacement from its own
        q (Gumbel-top-k on log q, the keys' order the draw order), verified with q (the without-replacement rule).
        Exact because whether a node exists never depends on its own value or its later siblings' (docs/ADT_TREE.md,
        "Trees"): the slots are allocated before drawing, from (d, k, children, node_budget) and the forced
        positions; which nodes of a layer are expanded (by cumulative score) only decides whether the NEXT layer's
        fresh, independent draws exist; no final rerank (EAGLE-2's prunes by a node's own score: biased here)."""
        B, V, dev, layout = state.ctx.batch, state.ctx.vocab_size, state.ctx.device, state.ctx.layout
        dmax, kmax = max(plan[0], 1), max(plan[1], 1)
        R, W = (2 * B if self.uses_cfg else B), self.attn_band
        f = state.frontier
        N = self.node_budget
        C, C1 = self.children, self.root_children  # siblings per expanded node (C1: the root's)
        budget = self._slot_budget()
        emax = max(1, kmax // C)  # nodes expanded per layer (forwarded through the layer)
        e_row = (state.draft.k // C).clamp(min=1)  # [B]
        plan = None
        if self.plans is not None:  # tree_shape=best_first: a static shape (static_tree.py), the
            plan = self.plans[dmax - 1]  # deepest the active rows asked for (rows share one shape per step)
            dmax = len(plan)
            sizes = [1] + [layer.expanded for layer in plan[1:]]
        else:
            sizes = self._expanded_sizes(dmax, emax)
        S = W + sum(sizes[1:])
        band, g_e = self._band_pass(state, S)
        # what each layer reads of its position, for every layer at once (no draw depends on it)
        depths = torch.arange(1, dmax + 1, device=dev)
        pos = f[:, None] + depths  # [B, dmax]
        forced_at = layout.forced[pos.clamp(max=layout.ext - 1)]
        forced_tok, is_forced_at, inside_at = forced_at.clamp(min=0), forced_at >= 0, forced_at != BEYOND_IMAGE
        gum_at = state.ctx.position_noise(pos) if state.ctx.reproducible else None  # [B, dmax, V]
        deep = depths[None] <= state.draft.d[:, None]  # [B, dmax]: the row's tree reaches the layer
        iota = torch.arange(max(S, N, C, C1), device=dev)  # slices: a layer's nodes, its siblings (<= N - 1)
        q_e = self._q(g_e, B)  # [B, 1, V]
        qs = [q_e]  # q of the expanded nodes, layer by layer (each node's children were drawn from it)
        q_off = 0
        score_e = torch.zeros(B, 1, device=dev)  # cumulative log q (EAGLE-2's score)
        key_e = torch.zeros(B, 1, device=dev)  # expansion key (see below)
        valid_e = torch.ones(B, 1, dtype=torch.bool, device=dev)
        gidx_e = torch.zeros(B, 1, dtype=torch.long, device=dev)
        anc_e = torch.zeros(R, 1, S, dtype=torch.bool, device=dev)
        n_alloc = torch.zeros(B, dtype=torch.long, device=dev)
        e_lim = torch.ones(B, dtype=torch.long, device=dev)  # expanded nodes allocated children this layer
        all_tok, all_par, all_score, all_valid, all_alloc = [], [], [], [], []
        depth_of, q_of = [], []  # each slot's layer and the index of the q it was drawn from (host lists)
        n_glob, slot0, cmax = 1, W, 1
        for d in range(1, dmax + 1):
            E = g_e.shape[1]
            layer = plan[d - 1] if plan is not None else None
            Cd = layer.children if layer is not None else (C1 if d == 1 else C)
            Ckd = min(Cd, V)
            cmax = max(cmax, Ckd)
            jc, ei = iota[:Cd], iota[:E]
            is_forced = is_forced_at[:, d - 1, None, None]
            # 1. allocation (before drawing): slot (i, j) of expanded node i, child j
            per = torch.where(is_forced, 1, Cd)
            rank = n_alloc[:, None, None] + ei[None, :, None] * per + jc[None, None, :]
            if layer is None:
                alloc = (ei[None, :, None] < e_lim[:, None, None]) & (jc[None, None, :] < per) & \
                    (rank < budget) & deep[:, d - 1, None, None]
            else:  # the static shape's slots; a forced position keeps the first only
                alloc = layer.alloc[None] & (jc[None, None, :] < per)
            layer_alloc = alloc.sum((1, 2))
            n_alloc = n_alloc + layer_alloc
            # 2. draws: Gumbel-top-k = an ordered sample without replacement from q
            # reproducible: every node of the layer with its position's noise (the coupled draft first)
            gum = gum_at[:, d - 1:d] if state.ctx.reproducible else -state.noise(B, E, V).log()
            tok = (q_e.log() + gum).topk(Ckd, dim=-1).indices  # [B, E, Ckd] in draw order
            if Ckd < Cd:
                tok = torch.cat([tok, tok.new_zeros(B, E, Cd - Ckd)], -1)
            lq = q_e.gather(-1, tok)
            alloc_e = alloc & valid_e[:, :, None]
            ok = alloc_e & (lq > 0) if Ckd == Cd else alloc_e & (lq > 0) & (jc < Ckd)[None, None]
            tok = torch.where(is_forced, forced_tok[:, d - 1, None, None], tok)
            ok = torch.where(is_forced, alloc_e, ok) & inside_at[:, d - 1, None, None]
            lq = torch.where(is_forced, 1.0, lq)
            sc = torch.where(ok, score_e[:, :, None] + lq.clamp(min=1e-30).log(), NEG)
            # expansion key: estimated log-probability that verification reaches the node -- the
            # j-th draw (0-based) of a node is the accepted one with about a (1 - a)^j (a = ACCEPT_GUESS):
            # given it was drawn, a sampled candidate's acceptance min(1, p/q) does not grow with q
            rk = torch.where(is_forced, 0.0, LOG_A + jc.float() * LOG_1MA)
            key = torch.where(ok, key_e[:, :, None] + rk, NEG)
            all_tok.append(tok.flatten(1))
            all_par.append(gidx_e[:, :, None].expand(B, E, Cd).flatten(1))
            all_score.append(sc.flatten(1))
            all_valid.append(ok.flatten(1))
            all_alloc.append(alloc.flatten(1))
            depth_of += [d] * (E * Cd)
            q_of += [q_off + i for i in range(E) for _ in range(Cd)]
            glob = n_glob  # this layer's slot i is the tree's node n_glob + i
            n_glob += E * Cd
            q_off += E
            if d == dmax:
                break
            # 3. the next layer's expanded nodes: the most likely reached of this layer
            En = sizes[d]
            sflat = sc.flatten(1)
            je = iota[:En]
            if layer is None:
                order = torch.sort(key.flatten(1), dim=1, descending=True, stable=True).indices[:, :En]  # [B, En]
                e_lim = torch.minimum(e_row, layer_alloc)
                valid_e = ok.flatten(1).gather(1, order) & (je[None] < e_lim[:, None])
            else:
                order = layer.order.expand(B, En)
                valid_e = ok.flatten(1).gather(1, order)
            g_e, q_e, anc = self._forward_chosen(B, d, tok, order, Cd, g_e, anc_e, slot0 + je, band)
            slot0 += En
            qs.append(q_e)
            score_e = sflat.gather(1, order)
            key_e = key.flatten(1).gather(1, order)
            gidx_e = glob + order
            anc_e = anc
        tok, par, sc = torch.cat(all_tok, 1), torch.cat(all_par, 1), torch.cat(all_score, 1)
        ok, al = torch.cat(all_valid, 1), torch.cat(all_alloc, 1)
        L = tok.shape[1]
        dep, qi = (torch.tensor(x, device=dev).expand(B, L) for x in (depth_of, q_of))
        keep = min(N - 1, L)
        big = torch.arange(L, device=dev).expand(B, L)
        sel = self._kept_slots(sc, al, big, keep).sort(dim=1).values
        return self._assemble(state, tok, par, ok, dep, sel, keep, L,
                              q_nodes=torch.cat(qs, 1), q_index=qi,
                              max_children=min(cmax, N - 1), dmax=dmax)

    def _expanded_sizes(self, dmax: int, emax: int) -> list:
        """Nodes expanded (forwarded through the layer) per layer of a `layers` tree of depth dmax: 1 (the root),
        then min(emax, the nodes the layer holds: the layer above's times its siblings per node)."""
        C, C1, V = self.children, self.root_children, self.model.geometry.vocab_size
        sizes = [1]
        for d in range(1, dmax):
            sizes.append(min(emax, sizes[-1] * min(C1 if d == 1 else C, V)))
        return sizes

    def _slot_budget(self) -> int:
        """Slots allocated before drawing: the tree's N - 1 drafts."""
        return self.node_budget - 1

    def _kept_slots(self, score, allocated, index, keep: int):
        """The allocated slots, in generation order (at most N - 1 of them); never by a node's own
        score (EAGLE-2's final rerank, biased for sampled candidates: tests/test_adt_tree.py plants it)."""
        L = index.shape[1]
        return torch.sort(torch.where(allocated, index, index + L), dim=1).indices[:, :keep]
