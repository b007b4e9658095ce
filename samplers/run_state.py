"""One generation's sequence tables (`SequenceLayout`), settings (`RunContext`) and step tensors (`LoopState`), which
the engine, every drafter and verification share: below all three."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..model_loaders.contract import ARImageModel, ImageGeometry
from ..model_loaders.precision.batch_invariant import SameImagePlan
from .randomness import Draws, PositionNoise, exponential_from_uniform, gumbel_coupling, sample_by_race
from .target import SamplingParams

# sentinels of `SequenceLayout.forced` (engine ids >= 0 are forced structure tokens)
IMAGE_POSITION = -1  # a position the model samples
BEYOND_IMAGE = -2  # a slot past the end of the image (drafts there are disabled)


@dataclass
class SequenceLayout:
    """Per-position tables of the generated sequence, extended past its end by `slack` slots so that windows and trees
    near the end keep their shape. Built once per generation."""

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


@dataclass(frozen=True)
class RunContext:
    """One generation's settings, fixed for its whole run: made by the engine, read by the drafter and verification
    (`LoopState.ctx`), the decode step, the compiled step and the statistics."""

    model: ARImageModel
    sampling: SamplingParams
    layout: SequenceLayout
    batch: int
    vocab_size: int
    device: torch.device
    reproducible: bool  # "same image as AR" (docs/REPRODUCIBLE.md): sampled with `position_noise`, agreement verifies
    position_noise: PositionNoise  # G [B, ..., V] of absolute positions [B, ...]: of the seed, row and position only
    compiled: bool  # the step runs compiled, one graph per plan value (a drafter may then plan fewer values)
    profile: bool  # every step synchronised and timed (on CUDA; a CPU run always is)
    seed: int
    backend: str  # the backend's name (samplers/backends.py)
    backend_params: tuple  # ((parameter, value), ...) in its schema's order, defaults filled in
    same_image: SameImagePlan  # how every target forward runs (batch-invariant, shape-pinned, plain) and its guarantee


@dataclass
class LoopState:
    """The tensors of one generation's steps, shared with the drafter (read-only for it, except `seq` beyond each row's
    frontier, which a drafter may use as its own scratch of drafts); its settings: `ctx`."""

    ctx: RunContext
    draws: Draws  # the step's random draws (replayed from a tape inside a compiled step)
    rows: torch.Tensor  # arange(batch)
    frontier: torch.Tensor  # [B] position of each row's pending token (committed, KV not cached yet)
    active: torch.Tensor  # [B] rows still generating
    seq: torch.Tensor  # [B, ext + 1] committed tokens up to the frontier; one spare column at the end
    step_count: torch.Tensor  # decode forwards so far on the device (0-dim long): what a step writes
    step: int = 0  # the same count on the host (a compiled step never reads it)
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

    def sample_at(self, q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """A token of q [B, ..., V] for positions pos [B, ...]: the ONE rule by which the target and every drafter draw
        a position. Reproducible: argmax(log q + G[b, pos]), the target's own sample when q is the target's p (a draft
        made so agrees with it as often as q allows); otherwise a race with fresh Exp(1) noise of q's shape from the
        generator."""
        if self.ctx.reproducible:
            return gumbel_coupling(q, self.ctx.position_noise(pos))
        return sample_by_race(q, self.noise(*q.shape))

    def write_tokens(self, pos: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> None:
        """seq[b, pos[b, i]] = tokens[b, i] where mask (positions distinct per row)."""
        r = self.rows[:, None].expand_as(pos)
        self.seq[r, torch.where(mask, pos, self.spare)] = tokens
