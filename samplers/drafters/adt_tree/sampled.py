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
        """candidate_mode="sampled": every expanded node draws `children` siblings WITHOUT
        replacement from its own q (Gumbel-top-k on log q, one batched op; the order of the keys
        is the draw order), verified with q (verify_tree's without_replacement rule).

        Exactness: whether a node exists never depends on its own value or its later siblings'.
        The slots are allocated before anything is drawn -- a function of (d, k, children,
        node_budget) and the forced positions only: layer 1 holds the root's `children` draws,
        every later layer the children of min(k // children, nodes allocated in the layer above)
        expanded nodes, slots counted in generation order and cut at node_budget - 1. Which
        nodes of a layer are expanded is decided by their cumulative score (product of q along
        the path), i.e. by values of that layer and above; that only decides the existence of
        the NEXT layer's draws, which are fresh and independent of it. There is no final rerank
        (EAGLE-2 prunes a node by its own score: biased for sampled candidates)."""
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
        kv, g_e, band_valid, fR = self._band_pass(state, S)
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
        all_tok, all_par, all_score, all_valid, all_depth, all_alloc, all_q = [], [], [], [], [], [], []
        n_glob, slot0, cmax = 1, W, 1
        for d in range(1, dmax + 1):
            E = g_e.shape[1]
            layer = plan[d - 1] if plan is not None else None
            Cd = layer.children if layer is not None else (C1 if d == 1 else C)
            Ckd = min(Cd, V)
            cmax = max(cmax, Ckd)
            jc = torch.arange(Cd, device=dev)
            ei = torch.arange(E, device=dev)
            pos_d = f + d
            forced = layout.forced[pos_d.clamp(max=layout.ext - 1)]
            is_forced = (forced >= 0)[:, None, None]
            # 1. allocation (before drawing): slot (i, j) of expanded node i, child j
            per = torch.where(forced >= 0, 1, Cd)[:, None, None]
            rank = n_alloc[:, None, None] + ei[None, :, None] * per + jc[None, None, :]
            if layer is None:
                alloc = (ei[None, :, None] < e_lim[:, None, None]) & (jc[None, None, :] < per) & \
                    (rank < budget) & (d <= state.draft.d)[:, None, None]
            else:  # the static shape's slots; a forced position keeps the first only
                alloc = layer.alloc[None] & (jc[None, None, :] < per)
            layer_alloc = alloc.sum((1, 2))
            n_alloc = n_alloc + layer_alloc
            # 2. draws: Gumbel-top-k = an ordered sample without replacement from q
            # reproducible: every node of the layer with its position's noise (the coupled draft first)
            gum = state.ctx.position_noise(pos_d)[:, None] if state.ctx.reproducible else -state.noise(B, E, V).log()
            tok = (q_e.log() + gum).topk(Ckd, dim=-1).indices  # [B, E, Ckd] in draw order
            if Ckd < Cd:
                tok = torch.cat([tok, tok.new_zeros(B, E, Cd - Ckd)], -1)
            lq = q_e.gather(-1, tok)
            ok = alloc & valid_e[:, :, None] & (lq > 0) & (jc < Ckd)[None, None]
            tok = torch.where(is_forced, forced[:, None, None].clamp(min=0), tok)
            ok = torch.where(is_forced, alloc & valid_e[:, :, None], ok)
            lq = torch.where(is_forced, 1.0, lq)
            ok = ok & (forced != BEYOND_IMAGE)[:, None, None]
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
            all_depth.append(torch.full((B, E * Cd), d, device=dev))
            all_q.append((q_off + ei)[None, :, None].expand(B, E, Cd).flatten(1))
            glob = n_glob + torch.arange(E * Cd, device=dev)
            n_glob += E * Cd
            q_off += E
            if d == dmax:
                break
            # 3. the next layer's expanded nodes: the most likely reached of this layer
            En = sizes[d]
            sflat = sc.flatten(1)
            je = torch.arange(En, device=dev)
            if layer is None:
                order = torch.sort(key.flatten(1), dim=1, descending=True, stable=True).indices[:, :En]  # [B, En]
                e_lim = torch.minimum(e_row, layer_alloc)
                valid_e = ok.flatten(1).gather(1, order) & (je[None] < e_lim[:, None])
            else:
                order = layer.order.expand(B, En)
                valid_e = ok.flatten(1).gather(1, order)
            g_e, q_e, anc = self._forward_chosen(B, d, tok, order, Cd, g_e, anc_e, slot0 + je, (kv, band_valid, fR))
            slot0 += En
            qs.append(q_e)
            score_e = sflat.gather(1, order)
            key_e = key.flatten(1).gather(1, order)
            gidx_e = glob[order]
            anc_e = anc
        tok, par, sc = torch.cat(all_tok, 1), torch.cat(all_par, 1), torch.cat(all_score, 1)
        ok, dep, al, qi = torch.cat(all_valid, 1), torch.cat(all_depth, 1), torch.cat(all_alloc, 1), torch.cat(all_q, 1)
        L = tok.shape[1]
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
