"""The drafter protocol: what every drafting method gives the engine and is told back.

One engine loop (samplers/engine.py) serves every backend:

    propose -> model.forward(tree) -> target p -> verify -> commit -> observe

A drafter owns everything method-specific: how draft tokens are made (Jacobi iteration, Hawk's
heads, an EAGLE layer), the exact q each was drawn from, its own caches, and the shape of its
trees. It proposes and observes only: its proposal (`DraftTree`, `DraftChain`) carries what
verification needs, and `samplers/verification/` (one home for every acceptance rule) turns it and
the target p into the `Verdict`. The engine owns the committed sequence, the model session, the
target distribution, statistics and the host read of each step.

Fixed shapes: a drafter proposes exactly `node_budget` nodes every step (pending token
included); a smaller tree is padded with nodes marked invalid (they ride in the forward, attend
to nothing harmful, and are never accepted). So the forward and all tensors keep one shape for a
whole generation even when the tree changes shape every step (graph-friendly on the GPU).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, List, Optional, Sequence, Union

import torch

from ...model_loaders.contract import ARImageModel, ForwardOutput, ImageGeometry
from ..randomness import Draws, PositionNoise, exponential_from_uniform, sample_by_race
from ..target import SamplingParams
from ..verification.agreement import gumbel_coupling
from ..verification.relaxed import Relaxed

# sentinels of `SequenceLayout.forced` (engine ids >= 0 are forced structure tokens)
IMAGE_POSITION = -1  # a position the model samples
BEYOND_IMAGE = -2  # a slot past the end of the image (drafts there are disabled)
SIBLINGS_INDEPENDENT = "independent"  # each sibling drawn from its own q (Hawk, deterministic top-k)
SIBLINGS_WITHOUT_REPLACEMENT = "without_replacement"  # siblings drawn without replacement from one q


@dataclass
class SequenceLayout:
    """Per-position tables of the generated sequence, extended past its end by `slack` slots so
    that windows and trees near the end keep their shape. Built once per generation."""

    geometry: ImageGeometry
    forced: torch.Tensor  # [ext] forced engine id, IMAGE_POSITION or BEYOND_IMAGE
    is_img: torch.Tensor  # [ext] bool
    prev_img: torch.Tensor  # [ext] latest image position < j (-1: none)
    last_img: int  # the last image position of the sequence
    ext: int  # positions covered (seq_len + slack)

    @classmethod
    def build(cls, geometry: ImageGeometry, slack: int, device) -> "SequenceLayout":
        n = geometry.seq_len
        ext = n + slack
        f = torch.full((ext,), BEYOND_IMAGE, dtype=torch.long)
        f[:n] = geometry.forced_tokens()
        if f[0] >= 0:
            raise ValueError("the first sequence position must be an image token")
        img_pos = torch.where(f == IMAGE_POSITION, torch.arange(ext), torch.full_like(f, -1))
        prev = torch.cummax(img_pos, 0).values  # latest image position <= j
        prev_img = torch.cat([torch.tensor([-1]), prev[:-1]])
        return cls(geometry=geometry, forced=f.to(device), is_img=(f == IMAGE_POSITION).to(device),
                   prev_img=prev_img.to(device), last_img=int((f == IMAGE_POSITION).nonzero().max()), ext=ext)


@dataclass
class LoopState:
    """The engine's state of one generation, shared with the drafter (read-only for it, except
    `seq` beyond each row's frontier, which a drafter may use as its own scratch of drafts)."""

    model: ARImageModel
    sampling: SamplingParams
    layout: SequenceLayout
    batch: int
    vocab_size: int
    device: torch.device
    draws: Draws  # the step's random draws (replayed from a tape inside a compiled step)
    seed: int
    rows: torch.Tensor  # arange(batch)
    frontier: torch.Tensor  # [B] position of each row's pending token (committed, KV not cached yet)
    active: torch.Tensor  # [B] rows still generating
    seq: torch.Tensor  # [B, ext + 1] committed tokens up to the frontier; one spare column at the end
    step: int = 0  # decode forwards so far (host; a compiled step never reads it)
    step_count: Optional[torch.Tensor] = None  # the same count on the device (0-dim long): what a step writes
    # "same image as AR" (docs/REPRODUCIBLE.md): every position is sampled by the race with its own
    # noise G[row, position] (`position_noise`), and verification accepts by agreement with it
    reproducible: bool = False
    _position_noise: Optional[PositionNoise] = None
    # the drafter's tensors that cross steps (its own dataclass): made by `Drafter.start`, passed to every phase
    # here, replaced by what `Drafter.observe` returns
    draft: Any = None

    @property
    def spare(self) -> int:
        """Index of the spare column of `seq`: masked-out writes land there (no read-back)."""
        return self.seq.shape[1] - 1

    def noise(self, *shape) -> torch.Tensor:
        """Exp(1) noise of `shape` (fresh draws)."""
        return exponential_from_uniform(self.draws.rand(shape))

    def uniform(self, *shape) -> torch.Tensor:
        return self.draws.rand(shape)

    def randint(self, low: int, high: int, *shape) -> torch.Tensor:
        return self.draws.randint(low, high, shape)

    def position_noise(self, pos: torch.Tensor) -> torch.Tensor:
        """G [B, ..., V] of the absolute positions pos [B, ...] of each row: a function of the seed,
        the image row and the position only (made on first use, for the whole generation)."""
        if self._position_noise is None:
            self._position_noise = PositionNoise(self.seed, self.batch, self.layout.ext, self.vocab_size, self.device)
        return self._position_noise(pos)

    def sample_at(self, q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """A token of q [B, ..., V] for positions pos [B, ...]: the ONE rule by which the target and
        every drafter draw a position. Reproducible: argmax(log q + G[b, pos]), the target's own
        sample when q is the target's p (a draft made so agrees with it as often as q allows);
        otherwise a race with fresh Exp(1) noise of q's shape from the generator."""
        if self.reproducible:
            return gumbel_coupling(q, self.position_noise(pos))
        return sample_by_race(q, self.noise(*q.shape))

    def write_tokens(self, pos: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> None:
        """seq[b, pos[b, i]] = tokens[b, i] where mask (positions distinct per row)."""
        r = self.rows[:, None].expand_as(pos)
        self.seq[r, torch.where(mask, pos, self.spare)] = tokens


@dataclass
class DraftTree:
    """One step's proposal for every row, padded to the drafter's node budget N.

    Node 0 is the pending token (already decided; its output is the target p of the next
    position). Node i > 0 sits at position ``frontier + depth(i)``. For every node, ``q[:, i]`` is
    the distribution its token was drawn from given everything verified before it (one-hot for a
    deterministic candidate such as a top-k choice or a copied token); nodes at forced positions
    hold the structure token and are always accepted."""

    tokens: torch.Tensor  # [B, N] engine ids
    parents: Union[Sequence[int], torch.Tensor]  # one tree for all rows (list) or [B, N] per row
    # what the tree rule reads (a `DraftChain` has its own)
    q: Optional[torch.Tensor] = None  # [B, N, V]
    valid: Optional[torch.Tensor] = None  # [B, N] bool
    siblings: str = SIBLINGS_INDEPENDENT
    depth: Optional[torch.Tensor] = None  # [B, N] or [N] depth of each node (0: the pending token)
    max_children: int = 1  # most valid children of any node (bounds the sibling loop)
    max_depth: int = 0  # deepest node
    relaxed: Optional[Relaxed] = None  # LOSSY: LANTERN's relaxed acceptance (verification/relaxed.py)


@dataclass
class DraftChain(DraftTree):
    """A Jacobi step's proposal: the chain [pending, d_1, ..., d_{T-1}] as nodes 0..T-1 (T = `length`), then, when
    `branch_depth` = D > 0, K - 1 proactive branches of D nodes under the pending token (node T + (k - 1) D + d - 1
    at depth d of branch k), whose first tokens are d_1's siblings drawn with it without replacement from one q.
    A node's q is its depth's: ``q`` [B, T, V] (None where not read: by agreement, or no drafts)."""

    length: int = 1
    enabled: Optional[torch.Tensor] = None  # [B, T - 1] the drafts this step may accept (a prefix of each row)
    branch_depth: int = 0
    branch_valid: Optional[torch.Tensor] = None  # [B, K - 1] each branch's first node is a live sibling


# what `propose` receives of `host_hint`: an int (0-dim hint; 0 without one) or a list of ints (1-D)
HostHint = Union[int, List[int]]


@dataclass
class Verdict:
    """What verification decided for every row."""

    n_accepted: torch.Tensor  # [B] drafts accepted (0: only the pending token is committed)
    path: Optional[torch.Tensor]  # [B, Dmax + 1] node index of the accepted path, root first (None: a chain)
    pending: torch.Tensor  # [B] the token after the accepted drafts (residual or fresh sample)
    tokens: torch.Tensor  # [B, Dmax + 1] tokens along the path (index 0: the old pending token)
    p_path: torch.Tensor  # [B, Dmax + 1, V] target of the position after each path node


@dataclass
class ChainVerdict(Verdict):
    """The verdict on a `DraftChain`, with what the Jacobi re-drafts need of the verification."""

    mrs_out: torch.Tensor  # [B, T - 1] verify_chain's output per position (the draft, or a residual sample);
    # by agreement: [B, T] the target's own sample after every line node
    noise: Optional[torch.Tensor]  # [B, T, V] the step's exponential noise (noise[:, i-1] served position
    # frontier + i); None when verified by agreement (re-drafts then read the position noise)
    n_enabled: torch.Tensor  # [B] positions the window verified (fewer accepted: a rejection)


class Drafter:
    """Base class of drafting methods. Subclasses set `name`, `node_budget` and implement
    `start`, `propose` and `observe`.

    A drafter object holds its configuration (and, for an adaptive one, its host-side policy); what
    changes on the device during a generation lives in its state object (`LoopState.draft`): made by
    `start`, read by every phase, returned anew by `observe`. A step is `plan` on the host (from the last
    host read: the step's shapes, a hashable value), then `propose` -> forward -> verify -> commit ->
    `observe` on the device, which read only the plan, `state` and their arguments: the compiled step
    (engine.decode_step) captures them as one graph per plan."""

    name: str = "drafter"
    node_budget: int = 1  # nodes per forward, pending token included
    slack: int = 3  # positions past the end of the image its trees may reach (node_budget + 2 is safe)
    lossless: bool = True
    # set by the engine: the step runs compiled, one graph per plan value (a drafter may then plan fewer values)
    compiled_step: bool = False

    def start(self, state: LoopState, first: ForwardOutput, p0: torch.Tensor) -> Any:
        """Called once after the prefill (p0 [B, V]: target of position 0, already sampled into
        seq[:, 0]); returns the drafter's state (`LoopState.draft`, None when it has none)."""
        return None

    def host_hint(self, state: LoopState) -> Optional[torch.Tensor]:
        """An integer tensor read back with the engine's one host read per step and passed to
        `propose` as `hint` (e.g. how many rows want a bigger tree), or None: 0-dim -> an int,
        1-D -> a list of ints (`HostHint`)."""
        return None

    def plan(self, state: LoopState, hint: HostHint) -> Hashable:
        """The host half of a step: the choices that set its shapes (a chain or a tree, a window, a
        tree's depth and width) from the hint of the step's one host read; hashable. The device
        phases read only this (never the hint): the compiled step keeps one graph per plan, so a plan
        takes few values. Default: the hint (tuple when a list)."""
        return tuple(hint) if isinstance(hint, list) else hint

    def propose(self, state: LoopState, plan: Hashable) -> DraftTree:
        raise NotImplementedError

    def one_off(self, plan: Hashable) -> bool:
        """The step just planned is a one-off (an adaptive drafter's probe of a shape it does not run): the
        compiled step runs it eager instead of compiling a graph for its plan."""
        return False

    def cost_shapes(self) -> dict:
        """{choice: parents} of the forward shapes whose cost the engine should time for this
        drafter before the first step (an adaptive drafter such as auto); {} for the rest."""
        return {}

    def set_costs(self, seconds: dict) -> None:
        """The engine's timings of `cost_shapes` (seconds per forward, same keys)."""

    def report(self) -> Optional[dict]:
        """What an adaptive drafter chose and why (GenerationStats.backend_report), or None."""
        return None

    def observe(self, state: LoopState, plan: Hashable, tree: DraftTree, verdict: Verdict, p: torch.Tensor,
                out: ForwardOutput, previous_frontier: torch.Tensor) -> Any:
        """Told after the commit (``state.frontier`` already moved; ``state.active`` still the
        step's): the verdict, every node's target p [B, N, V], the forward's output (hidden
        states of both CFG branches included) and each row's frontier before the step. Returns
        the drafter's next state (`LoopState.draft`)."""
        return state.draft
