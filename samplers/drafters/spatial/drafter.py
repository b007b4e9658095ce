"""SpatialDrafter: the `spatial` backend. SJD-PAC's window, verification, re-drafts and proactive branches
(`JacobiDrafter`) whose NEW positions are drafted by trained spatial heads from the target's hidden states of the rows
above; this class adds the heads, the store of hidden states they read, and the choice of q for entering positions.
Which head drafts a position, and why it is exact (hidden states of draft positions only ever DRAFT, never verify):
docs/SPATIAL.md, "The algorithm"."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...randomness import sample_by_race
from ...run_state import LoopState
from ..hidden_states import DraftsFromHiddenStates, HiddenStates
from ..jacobi.drafter import JacobiDrafter, JacobiState
from .network import load_heads
from .params import SpatialParams


@dataclass
class SpatialState(JacobiState):
    """The Jacobi state with the target's hidden states the heads read."""

    hidden: Optional[HiddenStates] = None  # hidden.states[r, j + 1]: the latest hidden state computed at position j
    hid_upto: Optional[torch.Tensor] = None  # [B] last position whose hidden state is computed


class SpatialDrafter(DraftsFromHiddenStates, JacobiDrafter):
    state_class = SpatialState

    def __init__(self, params: SpatialParams, model, sampling):
        super().__init__(params, model, sampling)
        self._use_target(model, sampling)
        self.depths = params.head_depths
        self.head_below = params.head_below  # heads only where the q above has max < this
        self.stride = model.geometry.row_stride
        dev = model.device
        self.heads = load_heads(model, self.depths, params.heads).to(dev).float().eval() if self.depths else None
        taps = self.heads.cfg.taps if self.heads is not None else (-1,)
        self.taps, self.last_tap = torch.tensor(taps, device=dev), taps[-1]

    # -- start -------------------------------------------------------------------------------
    def _new_state(self, state: LoopState, first) -> "SpatialState":
        ds = super()._new_state(state, first)
        # hidden.states[r, j + 1]: the latest hidden state computed at position j
        ds.hidden = self._start_hidden(state, first, state.ctx.layout.ext + 2)
        ds.hid_upto = torch.full((state.ctx.batch,), -1, dtype=torch.long, device=state.ctx.device)
        return ds

    # -- observe: keep the forward's hidden states, then the Jacobi update (which drafts entering positions)
    def observe(self, state, plan, tree, verdict, p_all, out, previous_frontier) -> "SpatialState":
        ds = state.draft
        if self.heads is not None:
            T, act = self.shapes[plan.window][0], state.active
            spare = ds.hidden.spare
            col = previous_frontier[:, None] + 1 + torch.arange(T, device=state.ctx.device)  # chain slot i: position f+i
            col = torch.where(act[:, None], col.clamp(max=spare - 1), spare)
            ds.hidden.write(state.rows, col, out.hidden[:, :T],
                              out.hidden_uncond[:, :T] if self.uses_cfg else None)
            ds.hid_upto = torch.where(act, previous_frontier + T - 1, ds.hid_upto)
        return super().observe(state, plan, tree, verdict, p_all, out, previous_frontier)

    # -- drafting entering positions -------------------------------------------------------------
    def _init(self, state, window, pos, need, init=None):
        if window and self.heads is not None:
            need = need & ~self._head_drafts(state, pos, need & state.ctx.layout.is_img[pos])
        super()._init(state, window, pos, need, init)  # the rest: the `init` rule

    def _heads_q(self, state, hp):
        """q [B, M, V] of positions hp [B, M] from the first head d = 1..head_depths whose source
        states are computed, and the mask of the positions some head reached."""
        B = hp.shape[0]
        rows = state.rows[:, None, None]
        hid, spare = state.draft.hidden.states, state.draft.hidden.spare
        g, reached = None, torch.zeros(hp.shape, dtype=torch.bool, device=state.ctx.device)
        for d in range(1, self.depths + 1):
            src = hp[:, :, None] - d * self.stride + self.taps  # [B, M, taps] source positions
            ok = (src[:, :, 0] >= -1) & (src[:, :, -1] <= state.draft.hid_upto[:, None]) & ~reached
            col = torch.where(ok[:, :, None], src + 1, spare)
            taps = hid[rows, col]  # [B, M, taps, D]
            if self.uses_cfg:
                taps = torch.cat([taps, hid[rows + B, col]])
            g_d = self.heads(taps, d)
            okR = ok.repeat(2, 1) if self.uses_cfg else ok
            g = g_d if g is None else torch.where(okR[..., None], g_d, g)
            reached = reached | ok
        return self._q(g, B), reached

    def _head_drafts(self, state, pos, need):
        """Draft the positions of `pos` [B, K] (consecutive per row, where `need`) that a head
        reaches; record their q. Returns the mask of positions drafted.

        Entering positions start after `drafted` (and after the frontier), and a head of depth
        d reaches a position only while its source row is computed (position <= hid_upto + d *
        stride - last tap, hid_upto = drafted), so only the first M = min(head_depths * stride - last tap, K)
        entering positions can be reached: the heads run on those M (a fixed shape), not on the
        whole window."""
        (B, K), V = pos.shape, state.ctx.vocab_size
        M = min(self.depths * self.stride - self.last_tap, K)
        first = torch.maximum(state.draft.drafted + 1, pos[:, 0])  # the first entering position
        hp = first[:, None] + torch.arange(M, device=state.ctx.device)  # [B, M] positions the heads may reach
        at = hp - pos[:, :1]  # their index in `pos`
        inside = (at >= 0) & (at < K)
        need_hp = inside & need.gather(1, at.clamp(0, K - 1))
        q, reached = self._heads_q(state, hp)
        use = need_hp & reached
        if self.head_below < 1.0:  # a confident q above (flat regions) keeps the `init` rule
            above = hp - self.stride
            known = (above >= 0) & (above <= state.draft.hid_upto[:, None])
            conf = state.draft.dist[state.rows[:, None], torch.where(known, above % self.ring, self.ring)].amax(-1)
            use = use & ~(known & (conf >= self.head_below))
        # reproducible: the shared position-noise draw; otherwise this module's race (tests plant a bug in it)
        x = state.sample_at(q, hp) if state.ctx.reproducible else sample_by_race(q, state.noise(B, M, V))
        self._write(state, hp, use, x, q)
        # back to `pos`'s columns (a scatter, no host read); column K takes the positions not drafted
        drafted = torch.zeros(B, K + 1, dtype=torch.bool, device=state.ctx.device)
        drafted = drafted.scatter(1, torch.where(use, at, K), True)[:, :K]
        return drafted
