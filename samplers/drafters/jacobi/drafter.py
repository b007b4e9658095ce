"""The Jacobi family: AR, SJD, SCD and SJD-PAC as one drafter (`JacobiDrafter`).

Drafts live in the engine's sequence buffer beyond each row's frontier (the previous step's
samples: Jacobi iteration) with the q each was drawn from in a ring of per-position
distributions. One step feeds the chain ``[pending, d_1, ..., d_{T-1}]``; verification accepts a
prefix of it, all positions at once (samplers/verification/step.py); positions it did not reach are
re-drafted from their new p (SJD: independently; SCD / adaptive continuation: coupled with the old
draft), and positions entering the window are initialised by `init`. SJD-PAC adds proactive drafting:
after a rejection the next forward also carries K-1 branches of depth D under the pending token,
drawn without replacement with the chain's draft at depth 1 (`_build_tree`). AR is this drafter with
an empty window: one slot, the pending token, and no drafts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch

from ....model_loaders.contract import ForwardOutput
from ...randomness import sample_by_race
from ...proposal import ChainVerdict, DraftChain, one_hot
from ...randomness import gumbel_coupling, race_keys
from ...run_state import BEYOND_IMAGE, LoopState
from ..base import Drafter
from .params import ARParams, JacobiParams, SCDParams, SJDPACParams, SJDParams


def slot_count(forced: torch.Tensor, window: int) -> int:
    """Slots per forward: the pending token plus the longest run of positions holding `window`
    image tokens (and the forced tokens between and right after them)."""
    n = forced.numel()
    count = (forced < 0).long().cumsum(0)  # image tokens at positions <= j
    last = torch.searchsorted(count, count + window, right=True) - 1  # last j with count <= count[c] + window
    last = last.clamp(max=n - 1)
    return int((last - torch.arange(n)).max()) + 1


class JacobiPlan(NamedTuple):
    """A Jacobi step's shape, chosen on the host from the last host read (`Drafter.plan`): the window, whether
    the proactive branches ride along (a row had a rejection), whether positions the window reaches for
    the first time are drafted before the step (`auto` growing its window), the `init` rule of the
    positions the step drafts afresh (None: the drafter's own; `auto` chooses it per step), and whether the step
    builds the proactive branches a next step may carry (`auto` skips them where they would not ride)."""

    window: int
    tree: bool = False
    grow: bool = False
    init: Optional[str] = None
    branches: bool = True


@dataclass
class JacobiState:
    """The Jacobi drafter's tensors that cross steps, passed to every phase in `LoopState.draft` and returned
    anew by `start` / `observe` (the ring of q is written by index in place: rollback is free)."""

    dist: torch.Tensor  # [B, ring + 1, V] q of each drafted position (target p of committed ones) at pos % ring
    drafted: torch.Tensor  # [B] last position that holds a draft
    in_tree: torch.Tensor  # [B] bool: rows whose next step carries the proactive branches
    stall: torch.Tensor  # [B] steps in a row that committed one token (stall restart)
    branch_tok: Optional[torch.Tensor] = None  # [B, K-1, D] the proactive branches (after a rejection)
    branch_valid: Optional[torch.Tensor] = None  # [B, K-1] bool: each branch's first node is a live candidate


class JacobiDrafter(Drafter):
    state_class: ClassVar[type] = JacobiState  # what `_new_state` makes (a subclass's state extends JacobiState)

    def __init__(self, params: JacobiParams, model, sampling):
        geo = model.geometry
        self.init = params.init
        # how positions verification did not reach are re-drafted: independent (SJD), maximal or gumbel
        self.redraft, self.coupling_strength = params.redraft, params.coupling_strength
        self.K, self.D = params.tree_width, params.tree_depth  # proactive tree: K candidates, depth D
        self.restart_after = params.restart_after
        if self.K > geo.vocab_size:
            raise ValueError(f"tree_width must be in [1, {geo.vocab_size}] (the image vocabulary), got {self.K}")
        self.shapes = {w: self._shape(geo, w) for w in params.windows}  # window -> (T, chain, tree parents)
        T_max = max(shape[0] for shape in self.shapes.values())
        self.slack = T_max + 2  # positions past the end of the image a window may reach
        self.node_budget = max(len(shape[2]) for shape in self.shapes.values())
        # ring of per-position draft distributions q (and targets of committed positions):
        # a position's entry lives at pos % ring; one spare entry at the end takes masked-out writes
        self.ring = geo.row_stride + T_max + 2
        self.window = next(iter(self.shapes))  # the window of the first step (`auto` changes it in `plan`)

    def _shape(self, geo, window: int) -> tuple:
        """(T, chain parents, tree parents) of a window: T chain slots (the pending token, `window`
        image drafts and the forced tokens among them); the tree adds K-1 branches of D nodes after
        the chain, each rooted at the pending slot (proactive drafting)."""
        T = min(slot_count(geo.forced_tokens(), window), geo.seq_len)
        chain = [-1] + list(range(T - 1))
        tree = list(chain)
        for _ in range(self.K - 1):
            for d in range(self.D):
                tree.append(0 if d == 0 else len(tree) - 1)
        return T, chain, tree

    # -- start -------------------------------------------------------------------------------
    def _new_state(self, state: LoopState, first: ForwardOutput) -> JacobiState:
        """The drafter's state at the start (`state_class`: a subclass fills its own fields after this)."""
        B, V, dev = state.ctx.batch, state.ctx.vocab_size, state.ctx.device
        return self.state_class(dist=torch.zeros(B, self.ring + 1, V, device=dev), drafted=state.frontier.clone(),
                           in_tree=torch.zeros(B, dtype=torch.bool, device=dev),
                           stall=torch.zeros(B, dtype=torch.long, device=dev))

    def start(self, state: LoopState, first: ForwardOutput, p0: torch.Tensor) -> JacobiState:
        B, dev = state.ctx.batch, state.ctx.device
        ds = state.draft = self._new_state(state, first)
        self._write(state, state.frontier[:, None], state.active[:, None], dists=p0[:, None])
        T = self.shapes[self.window][0]
        self._init(state, self.window, state.frontier[:, None] + torch.arange(1, T, device=dev),
                   torch.ones(B, T - 1, dtype=torch.bool, device=dev))
        ds.drafted = ds.drafted + T - 1
        return ds

    def host_hint(self, state: LoopState):
        """How many rows want the proactive tree in the next forward."""
        return (state.draft.in_tree & state.active).sum() if self.K > 1 else None

    def plan(self, state: LoopState, hint: int = 0) -> JacobiPlan:
        return JacobiPlan(self.window, tree=hint > 0)

    # -- propose -----------------------------------------------------------------------------
    def propose(self, state: LoopState, plan: JacobiPlan) -> DraftChain:
        T, chain_parents, tree_parents = self.shapes[plan.window]
        ds, rows = state.draft, state.rows
        if plan.grow:  # positions the window reaches for the first time get drafted by `init`
            pos = state.frontier[:, None] + torch.arange(1, T, device=state.ctx.device)
            self._init(state, plan.window, pos, (pos > ds.drafted[:, None]) & state.active[:, None], plan.init)
            ds.drafted = torch.where(state.active, torch.maximum(ds.drafted, state.frontier + T - 1), ds.drafted)
        pos = state.frontier[:, None] + torch.arange(T, device=state.ctx.device)
        chain = DraftChain(tokens=state.seq.gather(1, pos), parents=chain_parents, length=T)
        if T > 1:  # the drafts' q (by agreement: unused) and the slots this step verifies
            chain.q = None if state.ctx.reproducible else ds.dist[rows[:, None], pos % self.ring]
            chain.enabled = self._enabled(state, plan, pos[:, 1:])
        if plan.tree:  # proactive drafting: K-1 extra branches of depth D under the pending token
            chain.tokens = torch.cat([chain.tokens, ds.branch_tok.flatten(1)], 1)
            chain.parents, chain.branch_depth = tree_parents, self.D
            chain.branch_valid = ds.branch_valid & ds.in_tree[:, None]
        return chain

    def _enabled(self, state: LoopState, plan: JacobiPlan, dpos: torch.Tensor) -> torch.Tensor:
        """[B, T-1] the chain slots this step verifies: the window's image drafts (and the forced tokens
        among them), none past the end of the image."""
        layout = state.ctx.layout
        return (layout.is_img[dpos].long().cumsum(-1) <= plan.window) & (layout.forced[dpos] != BEYOND_IMAGE)

    # -- observe -----------------------------------------------------------------------------
    def observe(self, state: LoopState, plan: JacobiPlan, tree: DraftChain, verdict: ChainVerdict,
                p_all: torch.Tensor, out: ForwardOutput, previous_frontier: torch.Tensor) -> JacobiState:
        dev, active, ds = state.ctx.device, state.active, state.draft
        T = self.shapes[plan.window][0]
        frontier, new_frontier, n_acc, p = previous_frontier, state.frontier, verdict.n_accepted, verdict.p_path
        slot = torch.arange(T, device=dev)
        tpos = frontier[:, None] + 1 + slot  # positions of p's targets
        newly = (slot[None] <= n_acc[:, None]) & active[:, None]
        self._write(state, tpos, newly, dists=p)
        # re-draft the positions verification did not reach (we have their stale-context p)
        n_en = verdict.n_enabled
        refine = (tpos > new_frontier[:, None]) & (tpos <= (frontier + n_en + 1)[:, None]) & active[:, None] \
            & state.ctx.layout.is_img[tpos]
        y, q_y = self._redraft(state, p, tpos, verdict.mrs_out, verdict.noise)
        self._write(state, tpos, refine, y, q_y)
        # drafts for positions entering the window, then the proactive tree after a rejection
        # (and the whole window of a row the stall restart re-drafts: the same call, so no extra draws)
        npos = new_frontier[:, None] + slot[1:]
        need = (npos > ds.drafted[:, None]) & active[:, None]
        if self.restart_after:
            need = need | self._stalled_rows(state, verdict.n_accepted)[:, None]
        self._init(state, plan.window, npos, need, plan.init)
        ds.drafted = torch.where(active, torch.maximum(ds.drafted, new_frontier + T - 1), ds.drafted)
        if self.K > 1 and plan.branches:
            ds.in_tree = (n_acc < verdict.n_enabled) & active  # a rejection: the branches follow
            self._build_tree(state)
        elif self.K > 1:  # no branches built: no row may carry the old ones (drafted for an earlier frontier)
            ds.in_tree = torch.zeros_like(ds.in_tree)
        return ds

    def _stalled_rows(self, state, n_accepted):
        """Stall restart: the rows whose last `restart_after` steps each committed one token (counted in `stall`) get
        their whole window drafted afresh by `init` (coupled re-drafts can keep drafts made under a wrong prefix
        step after step: a fixed point). Lossless: the decision
        reads only the steps' counts.
        It widens the entering positions' `init` mask, which draws the same noise whichever positions it writes:
        a generation in which no row restarts keeps its tokens."""
        active, ds = state.active, state.draft
        stall = torch.where(active, torch.where(n_accepted == 0, ds.stall + 1, 0), ds.stall)
        restart = (stall >= self.restart_after) & active
        ds.stall = torch.where(restart, 0, stall)
        return restart

    # -- drafting ------------------------------------------------------------------------------
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
        layout, V, strat = state.ctx.layout, state.ctx.vocab_size, init or self.init
        need = need & layout.is_img[pos]
        B, K = pos.shape
        # the last image position before the first one to draft: the source of left-initialisation
        first = torch.where(need, pos, pos[:, -1:]).min(-1).values
        left = layout.prev_img[first].clamp(min=0)
        if strat == "random":
            uniform = torch.full((B, K, V), 1.0 / V, device=state.ctx.device)
            x = state.sample_at(uniform, pos) if state.ctx.reproducible else state.draws.randint(0, V, (B, K))
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
        if state.ctx.reproducible:  # the target's own samples at tpos (agreement verification): argmax(log p + G)
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
            coupled = gumbel_coupling(p, state.ctx.position_noise(tpos))
        if alpha < 1.0:
            coin = state.draws.rand(coupled.shape) < alpha
            coupled = torch.where(coin, coupled, fresh)
        return coupled

    def _build_tree(self, state):
        """K-1 extra branches for positions frontier+1 .. frontier+D, built without a forward from
        the distributions recorded there. Depth 1: candidates drawn WITHOUT replacement from q
        at frontier+1, excluding the chain's own draft (which is the first draw); deeper nodes:
        drawn independently for every branch from that position's q."""
        B, K, D, V, layout = state.ctx.batch, self.K, self.D, state.ctx.vocab_size, state.ctx.layout
        bpos = state.frontier[:, None] + torch.arange(1, D + 1, device=state.ctx.device)  # [B, D]
        q = state.draft.dist[state.rows[:, None], bpos % self.ring]  # [B, D, V]
        first = state.seq.gather(1, bpos[:, :1]).clamp(0, V - 1)  # the chain's draft at depth 1
        if state.ctx.reproducible:
            # the best K-1 of log q + G after the chain's draft (its own best when drafted from this q);
            # deeper: every branch the position's coupled draft (only the branch that agrees is followed)
            gumbel = state.ctx.position_noise(bpos)
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
        valid = (forced[:, :1] != BEYOND_IMAGE) & (ok1 | (forced[:, :1] >= 0))  # deeper: the chain's enabled slots
        state.draft.branch_tok, state.draft.branch_valid = tok, valid



class ARDrafter(JacobiDrafter):
    """AR: nothing to re-draft or record, so `observe` skips the window's bookkeeping (AR's step is mostly
    overhead on a CPU, and every speed-up is measured against it). Models with row-end tokens keep the Jacobi
    step: their chain also carries the forced token after the pending one (T = 2)."""

    def observe(self, state, plan, tree, verdict, p_all, out, previous_frontier):
        if self.shapes[plan.window][0] > 1:
            return super().observe(state, plan, tree, verdict, p_all, out, previous_frontier)
        return state.draft
