"""The Jacobi family: AR, SJD, SCD and SJD-PAC as one drafter.

Drafts live in the engine's sequence buffer beyond each row's frontier (the previous step's
samples: Jacobi iteration) with the q each was drawn from in a ring of per-position
distributions. One step feeds the chain ``[pending, d_1, ..., d_{T-1}]``; verification accepts a
prefix of it (`verify_chain`, all positions at once); positions it did not reach are re-drafted
from their new p (SJD: independently; SCD / adaptive continuation: coupled with the old draft),
and positions entering the window are initialised by `init`. SJD-PAC adds proactive drafting:
after a rejection the next forward also carries K-1 branches of depth D under the pending token,
drawn without replacement with the chain's draft at depth 1 (`_build_tree`, `_verify_siblings`).

AR (ar.py) is this drafter with an empty window: one slot, the pending token, and no drafts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional

import torch

from ...model_loaders.contract import ForwardOutput
from ..randomness import sample_by_race
from ..verify import (agree_candidates, agree_chain, gumbel_coupling, one_hot, race_keys,
                      verify_candidates, verify_chain)
from .base import BEYOND_IMAGE, IMAGE_POSITION, DraftTree, Drafter, LoopState, Verdict
from .params import COUPLINGS, INITS, MAX_TREE_WIDTH, MAX_WINDOW, Method, StepCost, chain_tokens, param


# -- parameters ---------------------------------------------------------------------------------
WINDOW_HELP = "draft tokens verified per forward (shrinks near the end of the image)"
INIT_HELP = "how new window positions are drafted: " + ", ".join(INITS)
# sample_above (from the distribution recorded one row above): the fastest lossless init on the demo model
# for sjd, scd, sjd_pac and auto (docs/BENCHMARKS.md, issue 26); the papers' random is preset='paper'
INIT_ABOVE_PAPER = "SJD paper: random (preset='paper'); sample_above is the fastest on the demo model"
# the defaults' init (issue 36): sample_above with no stall restart commits >= 0.977x its paper preset at window 16
# in every bench regime (seed sets pooled), 1.5x sample_left's tokens per forward on the demo model;
# docs/BENCHMARKS.md, "Defaults chosen on every regime"
INIT_ABOVE_REGIMES = ("SJD paper: random (preset='paper'); sample_above: >= 0.97x the paper's setting at window 16 in "
                      "every bench regime (docs/BENCHMARKS.md)")


def restart_param(default: int):
    """Stall restart (`JacobiDrafter._stalled_rows`): ours, not the papers' (preset='paper': off). sjd, scd and
    sjd_pac default to 0 (issue 36: a restart after 5 one-token steps costs 6-18% on the flat regime's target,
    docs/BENCHMARKS.md, "Defaults chosen on every regime"); auto to 16 (after 5 it cost 27% on the flat regime
    at window 64; after 16 nothing there, and it frees a demo image stuck at window 64); spatial keeps 5 (not
    measured there)."""
    return param(default, "re-draft the window by `init` after this many steps in a row that committed one token each "
                 "(a coupled Jacobi window stuck in a fixed point); 0: never", lo=0, hi=1024,
                 paper="not in the papers (preset='paper': 0); docs/BENCHMARKS.md, stall restart")


class JacobiParams:
    """What a Jacobi-family drafter reads from its parameters. A method sets by class attributes
    what it does not expose as a parameter: AR's empty window, SJD's independent re-drafts, the
    absence of a proactive tree."""

    window: ClassVar[int] = 0  # image drafts per forward (0: AR)
    init: ClassVar[str] = "random"
    redraft: ClassVar[str] = "independent"  # how unreached positions are re-drafted: independent, maximal, gumbel
    coupling_strength: ClassVar[float] = 0.0  # probability of a coupled re-draft (redraft != independent)
    tree_width: ClassVar[int] = 1  # proactive drafting: K candidates at the first open position (1: off)
    tree_depth: ClassVar[int] = 1
    restart_after: ClassVar[int] = 0  # stall restart (AR: nothing to restart)

    @property
    def windows(self) -> tuple:
        """The windows the drafter may use: one for a fixed backend; `auto` offers several."""
        return (self.window,)


@dataclass(frozen=True)
class SJDParams(JacobiParams):
    window: int = param(16, WINDOW_HELP, lo=1, hi=MAX_WINDOW, paper="SJD paper: 16 (32 and 64 also studied)",
                        sizes=True, essential=True)
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_REGIMES)
    restart_after: int = restart_param(0)


@dataclass(frozen=True)
class SCDParams(JacobiParams):
    window: int = param(16, WINDOW_HELP, lo=1, hi=MAX_WINDOW, paper="SCD paper: 16-64", sizes=True, essential=True)
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_REGIMES)
    coupling: str = param("maximal", "how re-drafts are coupled to the previous draft: maximal or gumbel",
                          choices=COUPLINGS, paper="SCD paper: maximal", essential=True)
    coupling_strength: float = param(1.0, "alpha: probability of a coupled (vs independent) re-draft", lo=0.0, hi=1.0,
                                     paper="SCD paper: 1.0 (0 = plain SJD re-drafting)")
    restart_after: int = restart_param(0)

    @property
    def redraft(self) -> str:
        return self.coupling


class ProactiveParams(JacobiParams):
    """SJD-PAC's proactive drafting and adaptive continuation (also spatial's)."""

    coupling_strength: ClassVar[float] = 1.0

    @property
    def redraft(self) -> str:
        return self.coupling if self.continuation else "independent"

    def check(self) -> None:
        if self.tree_depth > self.window:
            raise ValueError(f"tree_depth must be an int in [1, {self.window}], got {self.tree_depth} (a branch "
                             f"cannot be deeper than the window, {self.window})")


@dataclass(frozen=True)
class SJDPACParams(ProactiveParams):
    window: int = param(16, WINDOW_HELP, lo=1, hi=MAX_WINDOW, sizes=True, essential=True,
                        paper="SJD-PAC paper: 64 (preset='paper'); 16 is the fastest on a CPU (docs/BENCHMARKS.md)")
    tree_depth: int = param(2, "proactive drafting: depth D of the branches after a rejection (at most window)",
                            lo=1, hi=MAX_WINDOW, paper="SJD-PAC paper: D = 3 (preset='paper'); 2 is the fastest on "
                            "the demo model (docs/BENCHMARKS.md)", sizes=True, essential=True)
    tree_width: int = param(4, "proactive drafting: candidates K at the first open position (1 = off; at most the "
                            "image vocabulary)", lo=1, hi=MAX_TREE_WIDTH,
                            paper="SJD-PAC paper: K = 4 (the authors' code uses 3)", sizes=True, essential=True)
    continuation: bool = param(True, "adaptive continuation: keep verifying after the first rejection and keep "
                               "passing drafts", paper="SJD-PAC paper: on")
    init: str = param("sample_above", INIT_HELP, choices=INITS, paper=INIT_ABOVE_REGIMES)
    coupling: str = param("maximal", "the coupling adaptive continuation uses: maximal (the paper's) or gumbel",
                          choices=COUPLINGS, paper="SJD-PAC paper: maximal")
    restart_after: int = restart_param(0)


def slot_count(forced: torch.Tensor, window: int) -> int:
    """Slots per forward: the pending token plus the longest run of positions holding `window`
    image tokens (and the forced tokens between and right after them)."""
    n = forced.numel()
    count = (forced < 0).long().cumsum(0)  # image tokens at positions <= j
    last = torch.searchsorted(count, count + window, right=True) - 1  # last j with count <= count[c] + window
    last = last.clamp(max=n - 1)
    return int((last - torch.arange(n)).max()) + 1


@dataclass
class ChainVerdict(Verdict):
    """A Jacobi step's verdict, with what its re-drafts (`observe`) need of the verification."""

    mrs_out: torch.Tensor  # [B, T - 1] verify_chain's output per position (the draft, or a residual sample);
    # by agreement: [B, T] the target's own sample after every line node
    noise: Optional[torch.Tensor]  # [B, T, V] the step's exponential noise (noise[:, i-1] served position
    # frontier + i); None when verified by agreement (re-drafts then read the position noise)
    n_enabled: torch.Tensor  # [B] positions the window verified
    rejected: torch.Tensor  # [B] bool: a draft was rejected (the proactive tree follows)


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
    branch_valid: Optional[torch.Tensor] = None  # [B, K-1, D] bool


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
        B, V, dev = state.batch, state.vocab_size, state.device
        return self.state_class(dist=torch.zeros(B, self.ring + 1, V, device=dev), drafted=state.frontier.clone(),
                           in_tree=torch.zeros(B, dtype=torch.bool, device=dev),
                           stall=torch.zeros(B, dtype=torch.long, device=dev))

    def start(self, state: LoopState, first: ForwardOutput, p0: torch.Tensor) -> JacobiState:
        B, dev = state.batch, state.device
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
    def _chain_positions(self, state: LoopState, plan: JacobiPlan) -> torch.Tensor:
        """[B, T] positions of the chain's slots: the pending token, then the window's drafts."""
        return state.frontier[:, None] + torch.arange(self.shapes[plan.window][0], device=state.device)

    def propose(self, state: LoopState, plan: JacobiPlan) -> DraftTree:
        T, chain_parents, tree_parents = self.shapes[plan.window]
        if plan.grow:  # positions the window reaches for the first time get drafted by `init`
            ds = state.draft
            pos = state.frontier[:, None] + torch.arange(1, T, device=state.device)
            self._init(state, plan.window, pos, (pos > ds.drafted[:, None]) & state.active[:, None], plan.init)
            ds.drafted = torch.where(state.active, torch.maximum(ds.drafted, state.frontier + T - 1), ds.drafted)
        tokens = state.seq.gather(1, self._chain_positions(state, plan))
        if plan.tree:  # proactive drafting: K-1 extra branches of depth D under the pending token
            tokens = torch.cat([tokens, state.draft.branch_tok.flatten(1)], 1)
        return DraftTree(tokens=tokens, parents=tree_parents if plan.tree else chain_parents)

    # -- verify ------------------------------------------------------------------------------
    def _enabled(self, state: LoopState, plan: JacobiPlan, dpos: torch.Tensor) -> torch.Tensor:
        """[B, T-1] the chain slots this step verifies: the window's image drafts (and the forced tokens
        among them), none past the end of the image."""
        layout = state.layout
        return (layout.is_img[dpos].long().cumsum(-1) <= plan.window) & (layout.forced[dpos] != BEYOND_IMAGE)

    def verify(self, state: LoopState, plan: JacobiPlan, tree: DraftTree, p_all: torch.Tensor,
               out: ForwardOutput) -> Verdict:
        B, V, dev, rows = state.batch, state.vocab_size, state.device, state.rows
        layout, tokens, pos = state.layout, tree.tokens, self._chain_positions(state, plan)
        T = pos.shape[1]
        dpos = pos[:, 1:]
        q = state.draft.dist[rows[:, None], dpos % self.ring]
        forced = layout.forced[dpos] >= 0
        enabled = self._enabled(state, plan, dpos)
        if state.reproducible:
            return self._verify_by_agreement(state, plan, pos, tokens, p_all, forced, enabled)
        noise = state.noise(B, T, V)  # noise[:, i-1] serves position frontier+i
        u = state.uniform(B, T - 1)
        line, first, k_star = torch.arange(T, device=dev).expand(B, T), None, None
        if plan.tree:
            line, first, k_star = self._verify_siblings(state, T, tokens, p_all, q[:, 0], noise[:, 0], forced[:, 0])
        x_line, p = tokens, p_all
        if plan.tree:  # the verified line: the chain, or the chosen branch after the pending token
            x_line, p = tokens.gather(1, line), p_all[rows[:, None], line]
        n_acc, mrs_out = verify_chain(p[:, :-1], q, x_line[:, 1:], u, noise[:, :-1], enabled, forced, first=first)
        if plan.tree:
            n_acc = self._cap_branch_acceptance(n_acc, k_star)
        n_acc = torch.where(state.active, n_acc, 0)
        n_en = enabled.sum(-1)
        # the new pending token: correction after a rejection, else a fresh sample of p
        fresh_next = sample_by_race(p[rows, n_acc], noise[rows, n_acc])
        rejected = n_acc < n_en
        correction = torch.cat([mrs_out, fresh_next[:, None]], 1)[rows, n_acc]
        pending = torch.where(rejected, correction, fresh_next)
        return ChainVerdict(n_accepted=n_acc, path=line if plan.tree else None, pending=pending, tokens=x_line,
                            p_path=p, mrs_out=mrs_out, noise=noise, n_enabled=n_en, rejected=rejected)

    def _verify_by_agreement(self, state, plan, pos, tokens, p_all, forced, enabled) -> Verdict:
        """The same step by agreement (verify.agree_chain; docs/REPRODUCIBLE.md): a draft is accepted
        where it is the target's own sample of its position, the pending token is the target's sample
        after the last accepted draft. `mrs_out` then holds the target's sample after every line node:
        the Gumbel-coupled re-draft of each position (`_coupled_draft`)."""
        rows, T = state.rows, pos.shape[1]
        gumbel = state.position_noise(pos + 1)  # [B, T, V]: the position after each chain slot
        line, first, k_star = pos - state.frontier[:, None], None, None
        if plan.tree:  # depth 1: the chain's draft and the branches' first tokens are siblings
            cands, valid = self._sibling_candidates(state, tokens)
            k_star = agree_candidates(race_keys(p_all[:, 0], gumbel[:, 0]), cands, valid)
            k_star = torch.where(forced[:, 0], 0, k_star)  # a structure token: every branch holds it
            line = self._branch_line(T, k_star)
            first = k_star >= 0
        x_line, p = tokens.gather(1, line), p_all[rows[:, None], line]
        n_acc, samples = agree_chain(p, x_line[:, 1:], gumbel, enabled, forced, first=first)
        if plan.tree:
            n_acc = self._cap_branch_acceptance(n_acc, k_star)
        n_acc = torch.where(state.active, n_acc, 0)
        n_en = enabled.sum(-1)
        return ChainVerdict(n_accepted=n_acc, path=line if plan.tree else None, pending=samples[rows, n_acc],
                            tokens=x_line, p_path=p, mrs_out=samples, noise=None, n_enabled=n_en,
                            rejected=n_acc < n_en)

    def _sibling_candidates(self, state, tokens):
        """[B, K] depth-1 candidates (the chain's draft, then each branch's first token) and validity."""
        B, ds = state.batch, state.draft
        cands = torch.cat([tokens[:, 1:2], ds.branch_tok[:, :, 0]], 1).clamp(0, state.vocab_size - 1)
        valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=state.device),
                           ds.branch_valid[:, :, 0] & ds.in_tree[:, None]], 1)
        return cands, valid

    def _branch_line(self, T: int, k_star):
        """The slot line verification continues on: the chain, or branch k_star's D slots then the chain's."""
        D = self.D
        depth = torch.arange(T, device=k_star.device)
        branch_slot = T + (k_star.clamp(min=1) - 1)[:, None] * D + depth[None] - 1
        on_branch = (k_star[:, None] >= 1) & (depth[None] >= 1) & (depth[None] <= D)
        return torch.where(on_branch, branch_slot, depth[None])

    def _verify_siblings(self, state, T, tokens, p_all, q1, noise1, forced1):
        """Depth 1 of a tree step: the chain's draft and the branches' first tokens are siblings
        drawn without replacement from q1; verify them in order. Returns the slot line of the
        branch verification continues on, the depth-1 outcome (accepted, token) and the winner."""
        cands, valid = self._sibling_candidates(state, tokens)  # [B, K]
        u = state.uniform(state.batch, self.K)
        k_star, token = verify_candidates(p_all[:, 0], cands, u, noise1, q=q1, valid=valid)
        k_star = torch.where(forced1, 0, k_star)  # a structure token: every branch holds it
        line = self._branch_line(T, k_star)
        first = (k_star >= 0, torch.where(k_star >= 0, tokens.gather(1, line[:, 1:2]).squeeze(1), token))
        return line, first, k_star

    def _cap_branch_acceptance(self, n_acc, k_star):
        """When a proactive branch (k >= 1) won depth 1, its line holds only D nodes of its own:
        the chain's nodes after them were computed in the chain's context, so their outputs (the
        p of positions D+2, ...) and their KV are wrong for this branch. Acceptance stops at D;
        the output of branch node D (the exact p of position D+1) then yields the pending token:
        the MRS output there (a sample of that p whichever draft it verified), or a fresh sample."""
        return torch.where(k_star >= 1, n_acc.clamp(max=self.D), n_acc)

    # -- observe -----------------------------------------------------------------------------
    def observe(self, state: LoopState, plan: JacobiPlan, tree: DraftTree, verdict: Verdict, p_all: torch.Tensor,
                out: ForwardOutput, previous_frontier: torch.Tensor) -> JacobiState:
        dev, active, ds = state.device, state.active, state.draft
        T = self.shapes[plan.window][0]
        frontier, new_frontier, n_acc, p = previous_frontier, state.frontier, verdict.n_accepted, verdict.p_path
        slot = torch.arange(T, device=dev)
        tpos = frontier[:, None] + 1 + slot  # positions of p's targets
        newly = (slot[None] <= n_acc[:, None]) & active[:, None]
        self._write(state, tpos, newly, dists=p)
        # re-draft the positions verification did not reach (we have their stale-context p)
        n_en = verdict.n_enabled
        refine = (tpos > new_frontier[:, None]) & (tpos <= (frontier + n_en + 1)[:, None]) & active[:, None] \
            & state.layout.is_img[tpos]
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
            ds.in_tree = verdict.rejected & active
            self._build_tree(state)
        elif self.K > 1:  # no branches built: no row may carry the old ones (drafted for an earlier frontier)
            ds.in_tree = torch.zeros_like(ds.in_tree)
        return ds

    def _stalled_rows(self, state, n_accepted):
        """Stall restart: the rows whose last `restart_after` steps each committed one token (the counts
        are the drafter state's `stall`); their whole window is drafted afresh by `init`. Coupled re-drafts keep a
        draft wherever the new p still gives it mass, so drafts made under a wrong prefix can stay wrong step
        after step (a fixed point of the coupled iteration: docs/BENCHMARKS.md). Lossless: the decision
        reads only the steps' counts (never a draft), and the fresh drafts record their q like any init.
        The re-draft is the entering positions' `init` call with a wider mask: `init` draws the same
        noise whichever positions it writes, so a generation in which no row restarts keeps its
        tokens, and the restart costs no call of its own."""
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


def jacobi_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """A chain of `window` drafts, plus the proactive branches ((K - 1) x D nodes) where the method has them
    (they follow a rejection only: counted on every step, an upper bound)."""
    tree = (p.get("tree_width", 1) - 1) * p.get("tree_depth", 0)
    return StepCost(((chain_tokens(p["window"], row_codes) + tree, 1.0),))


SJD = Method("sjd", "SJD", "Speculative Jacobi Decoding (Teng et al.)", SJDParams, JacobiDrafter,
             paper_preset=(("init", "random"), ("restart_after", 0)), step_cost=jacobi_step_cost,
             bench_variants=("window=32",))
SCD = Method("scd", "SCD", "Speculative Jacobi Decoding with coupled re-drafts (So et al.)", SCDParams, JacobiDrafter,
             paper_preset=(("init", "random"), ("restart_after", 0)), step_cost=jacobi_step_cost,
             bench_variants=("window=32,coupling=maximal", "window=64,coupling=maximal", "window=32,coupling=gumbel"))
SJD_PAC = Method("sjd_pac", "SJD-PAC", "SJD with proactive drafting and adaptive continuation (Kang et al.)",
                 SJDPACParams, JacobiDrafter,
                 paper_preset=(("window", 64), ("tree_depth", 3), ("tree_width", 4), ("init", "random"),
                               ("restart_after", 0)), step_cost=jacobi_step_cost,
                 # the paper's ablation: SJD -> + proactive drafting -> + adaptive continuation -> L=64
                 bench_variants=("window=32,continuation=false", "window=32", "window=64"))

__all__ = ["JacobiDrafter", "JacobiPlan", "JacobiState", "slot_count", "IMAGE_POSITION", "SJD", "SCD", "SJD_PAC"]
