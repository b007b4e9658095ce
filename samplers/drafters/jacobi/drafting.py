"""How the Jacobi drafter drafts (`JacobiDrafting`, a mixin of `JacobiDrafter`): the drafts live in the
engine's sequence buffer beyond each row's frontier, and the q each was drawn from in a ring of
per-position distributions (`JacobiState.dist`, position j at j % ring).

- `_init`: positions entering the window, by the `init` rule (random, repeat_*, sample_*)
- `_redraft`: positions verification did not reach, from their new p (SJD: independently; SCD and
  adaptive continuation: coupled with the old draft, maximal or Gumbel)
- `_build_tree`: SJD-PAC's proactive branches after a rejection, without a forward
"""
from __future__ import annotations

import torch

from ...randomness import sample_by_race
from ...verification.agreement import gumbel_coupling, race_keys
from ...verification.rejection import one_hot
from ..base import BEYOND_IMAGE


class JacobiDrafting:
    """The drafting half of `JacobiDrafter` (it sets `ring`, `init`, `redraft`, `coupling_strength`, `K`, `D`)."""

    def _write(self, state, pos, mask, tokens=None, dists=None):
        """Masked writes of draft tokens into `seq` and their q into the ring (positions in one
        call are distinct per row; masked-out entries go to the spare column / slot)."""
        if tokens is not None:
            state.write_tokens(pos, mask, tokens)
        if dists is not None:
            r = state.rows[:, None].expand_as(pos)
            state.draft.dist[r, torch.where(mask, pos % self.ring, self.ring)] = dists

    def _init(self, state, window, pos, need, init=None):
        """Draft positions `pos` [B, K] (consecutive per row) where `need` by the rule `init` (None: the
        drafter's own); record their q."""
        if window == 0:  # AR drafts nothing
            return
        layout, V, strat = state.layout, state.vocab_size, init or self.init
        need = need & layout.is_img[pos]
        B, K = pos.shape
        # the last image position before the first one to draft: the source of left-initialisation
        first = torch.where(need, pos, pos[:, -1:]).min(-1).values
        left = layout.prev_img[first].clamp(min=0)
        if strat == "random":
            uniform = torch.full((B, K, V), 1.0 / V, device=state.device)
            x = state.sample_at(uniform, pos) if state.reproducible else state.randint(0, V, B, K)
            self._write(state, pos, need, x, uniform)
            return
        stride = layout.geometry.row_stride
        chunks = [(0, K)] if strat.endswith("_left") else [(s, min(s + stride, K)) for s in range(0, K, stride)]
        for s, e in chunks:  # sources of a chunk lie before it (row above, or the left source)
            p = pos[:, s:e]
            src = left[:, None].expand_as(p)
            if strat.endswith("_above"):
                above = p - stride
                src = torch.where(above >= 0, above, src)
            if strat.startswith("repeat"):
                x = state.seq.gather(1, src).clamp(0, V - 1)  # clamp: sources of masked-out slots may be structure
                q = one_hot(x, V)
            else:
                q = state.draft.dist[state.rows[:, None], src % self.ring]
                x = state.sample_at(q, p)
            self._write(state, p, need[:, s:e], x, q)

    def _redraft(self, state, p, tpos, mrs_out, noise):
        """Next step's draft at each target position (used where verification stopped short) and
        the q it is distributed as: always the new p, whether drawn independently or coupled."""
        return self._coupled_draft(state, p, tpos, mrs_out, noise), p

    def _coupled_draft(self, state, p, tpos, mrs_out, noise):
        if state.reproducible:  # the target's own samples at tpos (agreement verification): argmax(log p + G)
            return mrs_out
        fresh = sample_by_race(p, noise)
        kind, alpha = self.redraft, self.coupling_strength
        if kind == "independent":
            return fresh
        if kind == "maximal":
            # slots 1..T-1 had an old draft: MRS output couples it with the new p; the position
            # after the last slot had none, so it is drafted fresh
            coupled = torch.cat([mrs_out, fresh[:, -1:]], dim=1)
        else:  # Gumbel coupling: the noise of each (row, position), fixed for the generation
            coupled = gumbel_coupling(p, state.position_noise(tpos))
        if alpha < 1.0:
            coin = state.uniform(*coupled.shape) < alpha
            coupled = torch.where(coin, coupled, fresh)
        return coupled

    def _build_tree(self, state):
        """K-1 extra branches for positions frontier+1 .. frontier+D, built without a forward from
        the distributions recorded there. Depth 1: candidates drawn WITHOUT replacement from q
        at frontier+1, excluding the chain's own draft (which is the first draw); deeper nodes:
        drawn independently for every branch from that position's q."""
        B, K, D, V, layout = state.batch, self.K, self.D, state.vocab_size, state.layout
        bpos = state.frontier[:, None] + torch.arange(1, D + 1, device=state.device)  # [B, D]
        q = state.draft.dist[state.rows[:, None], bpos % self.ring]  # [B, D, V]
        first = state.seq.gather(1, bpos[:, :1]).clamp(0, V - 1)  # the chain's draft at depth 1
        if state.reproducible:
            # the best K-1 of log q + G after the chain's draft (its own best when drafted from this q);
            # deeper: every branch the position's coupled draft (only the branch that agrees is followed)
            gumbel = state.position_noise(bpos)
            keys = race_keys(q[:, 0], gumbel[:, 0]).scatter(1, first, float("-inf"))
            order = keys.topk(K - 1, dim=-1).indices
            ok1 = q[:, 0].gather(1, order) > 0
            deeper = gumbel_coupling(q[:, 1:], gumbel[:, 1:])[:, None].expand(B, K - 1, D - 1)
        else:
            keys = state.noise(B, V) / q[:, 0]  # exponential race keys: ascending order = draws w/o replacement
            keys = keys.scatter(1, first, float("inf"))
            order = keys.topk(K - 1, dim=-1, largest=False).indices  # [B, K-1], ascending: the first K-1 draws
            ok1 = torch.isfinite(keys.gather(1, order)) & (q[:, 0].gather(1, order) > 0)
            deeper = sample_by_race(q[:, None, 1:].expand(B, K - 1, D - 1, V), state.noise(B, K - 1, D - 1, V))
        tok = torch.cat([order[:, :, None], deeper], 2)  # [B, K-1, D]
        forced = layout.forced[bpos]
        tok = torch.where(forced[:, None] >= 0, forced[:, None], tok)
        valid = (forced[:, None] != BEYOND_IMAGE).expand(B, K - 1, D).clone()
        valid[:, :, 0] &= ok1 | (forced[:, None, 0] >= 0)
        state.draft.branch_tok, state.draft.branch_valid = tok, valid
