"""What the drafters that draft from the target's hidden states share (Hawk, ADT-Tree, spatial):
the store of those states by position and the draft distribution q of draft features."""
from __future__ import annotations

import torch

from ...model_loaders.contract import ForwardOutput
from ..target import target_probs


class HiddenStates:
    """The target's hidden states by position: ``states[r, j + 1]`` is the state computed at position
    j (j = -1: the prompt's last token); rows B.. hold the unconditional branch when the generation
    uses CFG. The last column (`spare`) takes masked-out writes."""

    def __init__(self, first: ForwardOutput, columns: int, device):
        self.uses_cfg = first.hidden_uncond is not None
        h0 = first.hidden[:, 0] if not self.uses_cfg else torch.cat([first.hidden[:, 0], first.hidden_uncond[:, 0]])
        self.states = torch.zeros(h0.shape[0], columns, h0.shape[-1], device=device)
        self.states[:, 0] = h0.float()
        self.spare = columns - 1

    def write(self, rows: torch.Tensor, cols: torch.Tensor, hidden: torch.Tensor, hidden_uncond) -> None:
        """hidden [B, n, D] (and the unconditional branch's) at columns cols [B, n] of rows [B]."""
        self.states[rows[:, None], cols] = hidden.float()
        if self.uses_cfg:
            self.states[(rows + rows.shape[0])[:, None], cols] = hidden_uncond.float()

    def write_path(self, rows: torch.Tensor, cols: torch.Tensor, out: ForwardOutput, path: torch.Tensor) -> None:
        """The states of the forward's nodes path [B, n] (the accepted path) at columns cols [B, n]."""
        idx = path[:, :, None].expand(*path.shape, out.hidden.shape[-1])
        self.write(rows, cols, out.hidden.gather(1, idx), out.hidden_uncond.gather(1, idx) if self.uses_cfg else None)


class DraftsFromHiddenStates:
    """Mixin of a drafter whose draft features live in the target's hidden space: `_use_target` in
    the constructor, `_start_hidden` in `start` (the store goes in the drafter's state), then `_q`."""

    def _use_target(self, model, sampling) -> None:
        self.model, self.sampling = model, sampling
        # draft features are computed in float32 and fed to the target's head in its own dtype
        self.head_dtype = model.embed_tokens(torch.zeros(1, dtype=torch.long, device=model.device)).dtype

    def _start_hidden(self, state, first: ForwardOutput, columns: int) -> HiddenStates:
        """A new store of the target's hidden states (part of the drafter's state: `LoopState.draft`)."""
        hidden = HiddenStates(first, columns, state.ctx.device)
        self.uses_cfg = hidden.uses_cfg  # the generation's guidance: configuration, fixed for the generation
        return hidden

    def _q(self, features: torch.Tensor, B: int) -> torch.Tensor:
        """q [B, ..., V] of draft features [R, ..., D] (R = 2B with CFG: cond rows first): the
        target's image head, guidance and sampling settings."""
        logits = self.model.image_logits(features.to(self.head_dtype))
        return target_probs(logits[:B], logits[B:] if self.uses_cfg else None, self.sampling)
