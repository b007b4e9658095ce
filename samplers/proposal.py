"""A step's proposal (`DraftTree`, `DraftChain`) and the verdict on it (`Verdict`, `ChainVerdict`): what
samplers/drafters/ make and samplers/verification/ judges, below both (neither imports the other)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

SIBLINGS_INDEPENDENT = "independent"  # each sibling drawn from its own q (Hawk, deterministic top-k)
SIBLINGS_WITHOUT_REPLACEMENT = "without_replacement"  # siblings drawn without replacement from one q


@dataclass(frozen=True)
class Relaxed:
    """LANTERN's relaxed acceptance of a proposal's tree (`DraftTree.relaxed`; LOSSY): A(x) = neighbours[x], budget
    delta; verification/relaxed.py's `relaxed_candidates` replaces `verify_candidates` at every depth of `verify_tree`
    (independent siblings only)."""

    neighbours: torch.Tensor  # [V, k] (`neighbour_table`)
    delta: float


def neighbour_table(model, k: int) -> torch.Tensor:
    """[V, k'] the k' = min(k, V - 1) nearest other codes of every image code, nearest first (L2 between the model's
    VQ codebook latents, or its image tokens' input embeddings where it exposes no codebook)."""
    V = model.geometry.vocab_size
    codebook = getattr(model, "codebook", None)
    if codebook is not None and getattr(codebook, "centroids", None) is not None:
        lat = codebook.centroids.float().cpu()
    else:  # no VQ codebook exposed (tiny models): the image tokens' input embeddings
        lat = model.embed_tokens(torch.arange(V, device=model.device)).float().cpu()
    dist = torch.cdist(lat, lat)
    dist.fill_diagonal_(float("inf"))
    kk = max(min(k, V - 1), 1)
    return dist.topk(kk, dim=-1, largest=False).indices


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q of deterministic candidates (copied or top-k-chosen tokens): accept with p(x)."""
    return torch.nn.functional.one_hot(tokens, vocab_size).to(torch.float32)


@dataclass
class DraftTree:
    """One step's proposal for every row, padded to the drafter's node budget N.

    Node 0 is the pending token (already decided; its output is the target p of the next position). Node i > 0 sits at
    position ``frontier + depth(i)``. For every node, ``q[:, i]`` is the distribution its token was drawn from given
    everything verified before it (one-hot for a deterministic candidate such as a top-k choice or a copied token);
    nodes at forced positions hold the structure token and are always accepted."""

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
    `branch_depth` = D > 0, K - 1 proactive branches of D nodes under the pending token (node T + (k - 1) D + d - 1 at
    depth d of branch k), whose first tokens are d_1's siblings drawn with it without replacement from one q. A node's q
    is its depth's: ``q`` [B, T, V] (None where not read: by agreement, or no drafts)."""

    length: int = 1
    enabled: Optional[torch.Tensor] = None  # [B, T - 1] the drafts this step may accept (a prefix of each row)
    branch_depth: int = 0
    branch_valid: Optional[torch.Tensor] = None  # [B, K - 1] each branch's first node is a live sibling


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
