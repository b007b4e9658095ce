"""Live preview: the partial image while tokens are committed, throttled to a share of the run.

`PartialImage` is what `RunOptions(preview=...)` calls: the engine asks `due()` (a clock read on
the host, nothing from the device) at each step's host read, and only when it says yes hands over
the sequence, which is then copied to the host and decoded. The throttle adapts to the decoder: after
a decode that took d seconds the next one waits at least d / share, so previews cost at most about
`share` of the generation time however slow the decoder is (measured by `python -m specar bench
--preview`).
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

import torch

# how often the node (and the bench measuring it) decodes a preview: at most every 0.25 s, and
# at most 3 % of the generation's time
PREVIEW_THROTTLE = {"min_interval_s": 0.25, "share": 0.03}
OVERLAY_STOPS = torch.tensor([[0.27, 0.00, 0.33], [0.23, 0.32, 0.55], [0.13, 0.57, 0.55], [0.37, 0.79, 0.38],
                              [0.99, 0.91, 0.14]])  # viridis-like: dark = one token per step, yellow = long runs


def _viridis(t: torch.Tensor) -> torch.Tensor:
    x = t.clamp(0, 1) * (len(OVERLAY_STOPS) - 1)
    i = x.floor().long().clamp(max=len(OVERLAY_STOPS) - 2)
    frac = (x - i)[..., None]
    return OVERLAY_STOPS[i] * (1 - frac) + OVERLAY_STOPS[i + 1] * frac


class PartialImage:
    """Decode the committed part of the image now and then and hand it to `emit(images, done, total)`.

    Positions not committed yet show grey; with `overlay`, committed tokens are tinted by how many
    tokens the step that committed them accepted (dark: one, yellow: the longest run so far).
    `min_interval_s`: the shortest time between two previews; `share`: the largest share of the
    elapsed time previews may take (adaptive throttle)."""

    def __init__(self, model, emit: Callable[[List, int, int], None], overlay: bool = False,
                 min_interval_s: float = 0.25, share: float = 0.03):
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), got {share!r}")
        self.model, self.emit, self.overlay = model, emit, overlay
        self.min_interval_s, self.share = float(min_interval_s), float(share)
        geo = model.geometry
        self.positions = geo.image_positions()
        self.H, self.W, self.V = geo.height, geo.width, geo.vocab_size
        self.next_at = time.perf_counter() + self.min_interval_s  # the first preview after a short while
        self.spent_s = 0.0
        self.shown = 0

    def for_stage(self, model) -> "PartialImage":
        """This preview (what it emits to, its overlay and throttle) for another grid: a two-grid model's first."""
        return PartialImage(model, self.emit, self.overlay, self.min_interval_s, self.share)

    def due(self) -> bool:
        return time.perf_counter() >= self.next_at

    def __call__(self, seq: torch.Tensor, done: torch.Tensor, at_step: Optional[torch.Tensor] = None) -> None:
        """seq [B, seq_len] and done [B] (committed positions per row) on the model's device; at_step
        [B, seq_len]: the step that committed each position (for the overlay)."""
        t0 = time.perf_counter()
        pos = self.positions.to(seq.device)
        B = seq.shape[0]
        grid = seq[:, pos].view(B, self.H, self.W).cpu()
        committed = (pos[None, :] < done[:, None]).view(B, self.H, self.W).cpu()
        grid = torch.where(committed, grid, 0)  # drafts and empty slots are not part of the image yet
        images = self.render(grid, committed, None if at_step is None else at_step[:, pos].view(B, self.H, self.W).cpu())
        self.emit(images, int(committed.sum()), B * self.H * self.W)
        spent = time.perf_counter() - t0
        self.spent_s += spent
        self.shown += 1
        self.next_at = time.perf_counter() + max(self.min_interval_s, spent / self.share)

    def render(self, grid: torch.Tensor, committed: torch.Tensor, at_step: Optional[torch.Tensor]) -> list:
        """[B, H, W] codes -> PIL images, uncommitted tokens greyed out (and the overlay tint)."""
        from PIL import Image
        decoded = self.model.decode_preview(grid)
        if decoded:
            pixels = torch.stack([torch.from_numpy(_rgb_array(im)) for im in decoded]).float() / 255
        else:  # no decoder: the codes as grey levels
            pixels = (grid.float() / max(self.V - 1, 1))[..., None].expand(-1, -1, -1, 3)
        B, h, w, _ = pixels.shape
        mask = torch.nn.functional.interpolate(committed[:, None].float(), size=(h, w), mode="nearest")[:, 0, ..., None]
        grey = torch.full_like(pixels, 0.5)
        out = pixels * mask + grey * (1 - mask)
        if self.overlay and at_step is not None:
            tint = torch.zeros(B, self.H, self.W, 3)
            for b in range(B):
                steps = at_step[b][committed[b]]
                if steps.numel():
                    length = torch.bincount(steps)[at_step[b].clamp(min=0)].float()
                    tint[b] = _viridis((length - 1) / max(float(length.max()) - 1, 1.0))
            tint = torch.nn.functional.interpolate(tint.permute(0, 3, 1, 2), size=(h, w), mode="nearest")
            out = torch.where(mask > 0, 0.5 * out + 0.5 * tint.permute(0, 2, 3, 1), out)
        arr = (out.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        return [Image.fromarray(a) for a in arr]


def _rgb_array(image):
    import numpy as np
    return np.asarray(image.convert("RGB"), dtype=np.uint8).copy()
