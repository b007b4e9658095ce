"""The model contract every adapter implements (docs/ARCHITECTURE.md, "Model contract": engine ids at this boundary,
image codes first; logits over the image codes only; the image batch first in every tensor, CFG rows inside)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch


@dataclass(frozen=True)
class ImageGeometry:
    """Layout of the generated token sequence.

    The sequence is ``height`` rows of ``width`` image tokens, each row followed by a forced
    row-end token when ``row_end`` is set (Lumina-mGPT, Emu3). Forced tokens are never sampled
    and never drafted; the engine fills them in.
    """

    height: int
    width: int
    vocab_size: int
    row_end: bool = False

    def __post_init__(self):
        for name in ("height", "width", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ImageGeometry.{name} must be a positive int, got {v!r}")

    @property
    def row_stride(self) -> int:
        """Sequence positions per image row (row-end token included)."""
        return self.width + int(self.row_end)

    @property
    def seq_len(self) -> int:
        return self.height * self.row_stride

    @property
    def num_image_tokens(self) -> int:
        return self.height * self.width

    @property
    def row_end_id(self) -> Optional[int]:
        """Engine id of the row-end token, or None."""
        return self.vocab_size if self.row_end else None

    def forced_tokens(self) -> torch.Tensor:
        """LongTensor [seq_len]: the forced engine id at each position, -1 where sampled."""
        forced = torch.full((self.seq_len,), -1, dtype=torch.long)
        if self.row_end:
            forced[self.width :: self.row_stride] = self.vocab_size
        return forced

    def image_positions(self) -> torch.Tensor:
        """LongTensor [num_image_tokens]: sequence positions of the image tokens, raster order."""
        return (self.forced_tokens() < 0).nonzero().flatten()


@dataclass
class EncodedPrompt:
    """Token ids of the conditional and unconditional (CFG) branches, model vocabulary."""

    cond: list
    uncond: list
    text: str = ""
    negative_text: str = ""


@dataclass
class ForwardOutput:
    """Logits of the NEXT position for every input token, image codes only."""

    cond: torch.Tensor  # [B, T, V] float
    uncond: Optional[torch.Tensor] = None  # [B, T, V] float, None without CFG
    hidden: Optional[torch.Tensor] = None  # [B, T, D] last hidden states of the conditional rows
    hidden_uncond: Optional[torch.Tensor] = None  # [B, T, D] of the unconditional rows (CFG only)


@dataclass
class Session:
    """State of one generation: the KV cache and how much of it each image row has committed."""

    batch: int
    cfg: bool
    committed: torch.Tensor  # LongTensor [B] on device: sequence positions whose KV is cached
    first: ForwardOutput  # logits for sequence position 0 (from the prefill), T == 1
    state: Any = None  # adapter-private (cache tensors, masks, offsets)
    extras: dict = field(default_factory=dict)


class ARImageModel(ABC):
    """One adapter per model family (docs/ARCHITECTURE.md, "Model contract")."""

    geometry: ImageGeometry
    name: str = "model"
    folder: Optional[str] = None  # where the weights live; trained drafters are looked up beside them
    random_drafter_seed: Optional[int] = None  # tiny test models: drafters get random weights (no files)
    capturable: bool = False  # `forward` and `commit` can run inside a caller's compiled graph: `start(captured=True)`
    # the family's recommended sampling settings, used when generate() is not told otherwise
    default_sampling: dict = {"cfg_scale": 1.0, "top_k": 0}  # top_k 0: no top-k

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @abstractmethod
    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        """Token ids of both CFG branches, in the format the family was trained with."""

    @abstractmethod
    def start(self, prompt: EncodedPrompt, batch: int, cfg: bool, draft_capacity: int,
              captured: bool = False) -> Session:
        """Prefill (cond and uncond as one batch when `cfg`), reserve room for `draft_capacity`
        draft tokens beyond the full sequence, and return the session with position 0's logits.
        ``captured`` (only where `capturable`): the caller runs the session's `forward` and `commit`
        inside its own compiled graph (the engine's compiled decode step), so the session is laid out
        with static shapes and its buffers at addresses the device's graphs can keep (CUDA graphs);
        `forward` and `commit` must then be traceable as one graph (no host read, no data-dependent
        shape)."""

    @abstractmethod
    def forward(self, session: Session, tokens: torch.Tensor, parents) -> ForwardOutput:
        """Evaluate draft tokens [B, T] (engine ids) placed after each row's committed prefix in
        one forward pass. ``parents[i]`` is the index of node i's parent (-1: the last committed
        token); a chain is ``[-1, 0, 1, ...]``. ``parents`` is a sequence (one tree for every row)
        or a LongTensor [B, T] (one tree per row, e.g. dynamic draft trees). Node i sits at
        sequence position ``committed + depth(i)`` and attends to the prefix and its ancestors only."""

    @abstractmethod
    def commit(self, session: Session, path: torch.Tensor, length: torch.Tensor) -> None:
        """Keep the KV entries of the accepted path of the last forward: for row b the nodes
        ``path[b, :length[b]]`` (root first) become sequence positions
        ``committed[b] .. committed[b] + length[b] - 1``; everything else is dropped. Never
        recomputes the prefix. A chain (``path[b, k] == k``) costs no copy."""

    # -- what trained drafters (Hawk heads, EAGLE layers) need from the target ----------------
    max_positions: Optional[int] = None  # positions the model supports (None: unlimited)

    def positions_needed(self, prompt_tokens: int, draft_capacity: int) -> int:
        """Positions a generation uses: the prompt, the image and the draft slots of a forward."""
        return prompt_tokens + self.geometry.seq_len + draft_capacity + 1

    @property
    def hidden_size(self) -> int:
        """Width D of `ForwardOutput.hidden`."""
        raise NotImplementedError(f"{type(self).__name__} does not expose hidden states")

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's own image-code head on hidden states [..., D] -> logits [..., V]."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its image head")

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embeddings [..., D] of engine ids (image codes and structure tokens)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its token embeddings")

    def torch_module(self) -> "torch.nn.Module":
        """The network whose weights identify this model (drafter fingerprints)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its weights")

    def decode_tokens(self, tokens: torch.Tensor, prompt: Optional[EncodedPrompt] = None):
        """[B, H, W] image codes -> list of PIL images, or None when the model has no decoder. ``prompt``: the
        EncodedPrompt the codes were generated from (`GenerationResult.prompt`), for a decoder conditioned on it
        (GLM-Image's DiT renders its text); a VQ decoder ignores it."""
        return None

    def decode_preview(self, tokens: torch.Tensor):
        """[B, H, W] image codes, partly committed -> PIL images for the live preview, or None (the codes as grey
        levels). The decoder by default; a model whose decoder is too slow to run every few steps, or that has none
        for a grid (GLM-Image's DiT, its preview grid), renders something cheaper."""
        return self.decode_tokens(tokens)

    # -- two-grid models (GLM-Image: a preview grid, then the image's grid after it) ----------------
    def preceding_stage(self) -> Optional["ARImageModel"]:
        """The stage generated before this one from a text prompt (same weights, its own grid), or None (one
        grid). `generate` runs it first, then this one from `prompt_after`."""
        return None

    def prompt_after(self, text: str, codes: torch.Tensor, negative_text: str = "") -> EncodedPrompt:
        """This stage's prompt after one image's codes [n] of `preceding_stage`."""
        raise NotImplementedError(f"{type(self).__name__} has no preceding stage")

    # -- image-to-image (GLM-Image: reference images before the prompt) ---------------------------------------------
    max_reference_images = 0  # how many reference images `reference_prompt` takes (0: none)

    def reference_prompt(self, text: str, images, negative_text: str = "") -> EncodedPrompt:
        """The prompt of an image made after 1 to `max_reference_images` reference images (PIL images or float
        tensors 0..1 [H, W, C] / [B, H, W, C])."""
        raise NotImplementedError(f"{type(self).__name__} takes no reference images")

    def check_prompt(self, prompt) -> EncodedPrompt:
        """Accept a string or an EncodedPrompt; anything else is a clear ValueError."""
        if isinstance(prompt, EncodedPrompt):
            return prompt
        if isinstance(prompt, str):
            return self.encode_prompt(prompt)
        raise ValueError(
            f"prompt must be a str or an EncodedPrompt from model.encode_prompt(), got {type(prompt).__name__}"
        )


def check_texts(text, negative_text) -> None:
    """What every `encode_prompt` checks first: both texts are strings."""
    for name, value in (("prompt", text), ("negative_prompt", negative_text)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a str, got {type(value).__name__}")


def tree_depths(parents: Sequence[int]) -> list:
    """Depth of every node (root children of the committed prefix have depth 0)."""
    depths = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent must be -1 or an earlier node index")
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


def tree_ancestry(parents: Sequence[int]) -> torch.Tensor:
    """BoolTensor [T, T]: ``anc[i, j]`` is True when node j is node i or one of its ancestors."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return anc
