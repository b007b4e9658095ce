"""The spatial heads: a draft distribution for an image position from the target's hidden states of the row(s) above
it (head d on the states at A - 1, A, A + 1, A = P - d * row_stride: docs/SPATIAL.md, "The algorithm"), and their
files:

    x = [h_{A-1}; h_A; h_{A+1}]               (3D features)
    g = h_{A-1} + SiLU(W_d x + b_d)            (W_d: D x 3D, zero-initialised)
    logits = model.image_logits(g)             (the target's own image head)

An untrained (zero) head gives the target's distribution of the token above P (SJD's `sample_above`). With CFG the
head runs on both branches' states and the two logit vectors go through `target_probs` like the target's. Files:
`<model folder>/spatial_heads/` (kind "spatial"; `weight` [depths, D, 3D], `bias` [depths, D]) through
model_loaders/files/drafter_files.py, which refuses heads trained for another model."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ....model_loaders.files.drafter_files import (WEIGHTS_FILE, check_shapes, drafter_folder, load_heads_config,
                                                   use_random_drafter)

KIND = "spatial"
FOLDER = "spatial_heads"  # beside the model's weights
TAPS = (-1, 0, 1)  # default offsets from A = P - d * row_stride of the hidden states a head reads


@dataclass
class SpatialConfig:
    hidden_size: int
    depths: int = 2  # heads for the rows 1..depths above
    taps: tuple = TAPS  # offsets from A of the states read, ascending, starting at -1 (the residual's base)

    def __post_init__(self):
        self.taps = tuple(int(t) for t in self.taps)
        if not self.taps or self.taps[0] != -1 or list(self.taps) != sorted(set(self.taps)) or self.taps[-1] > 1:
            raise ValueError(f"spatial head taps must be ascending offsets in [-1, 1] starting at -1, got {self.taps}")

    def to_dict(self) -> dict:
        return {**asdict(self), "taps": list(self.taps)}


class SpatialHeads(nn.Module):
    def __init__(self, cfg: SpatialConfig):
        super().__init__()
        self.cfg = cfg
        D, n = cfg.hidden_size, cfg.depths
        self.weight = nn.Parameter(torch.zeros(n, D, len(cfg.taps) * D))
        self.bias = nn.Parameter(torch.zeros(n, D))

    def expected_shapes(self) -> dict:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}

    def forward(self, taps: torch.Tensor, depth: int) -> torch.Tensor:
        """taps [..., len(cfg.taps), D] (states at A + cfg.taps, A = P - depth * row_stride) -> features g [..., D]."""
        x = taps.flatten(-2) @ self.weight[depth - 1].T + self.bias[depth - 1]
        return taps[..., 0, :] + torch.nn.functional.silu(x)


def random_heads(cfg: SpatialConfig, seed: int) -> SpatialHeads:
    """Random-weight heads for tiny test models (no files)."""
    heads = SpatialHeads(cfg)
    D = cfg.hidden_size
    g = torch.Generator().manual_seed(int(seed) * 1000 + 71)
    with torch.no_grad():
        heads.weight.copy_(torch.randn(heads.weight.shape, generator=g) * 2.0 * (len(cfg.taps) * D) ** -0.5)
        heads.bias.copy_(torch.randn(heads.bias.shape, generator=g) * 0.5)
    return heads


def load_heads(model, depths: int, folder: str = "") -> SpatialHeads:
    """The model's spatial heads (the first `depths` of the file); random-weight heads for tiny test
    models (random_drafter_seed, no file); else a ValueError naming the training command."""
    path = folder or drafter_folder(model, FOLDER)
    if use_random_drafter(model, folder, path):
        return random_heads(SpatialConfig(model.hidden_size, depths), model.random_drafter_seed)
    # no folder: load_drafter's error names the training command
    tensors, cfg = load_heads_config(path, KIND, model, SpatialConfig, "spatial-heads", beside=FOLDER)
    check_shapes(os.path.join(path, WEIGHTS_FILE), tensors, SpatialHeads(cfg).expected_shapes())
    if depths > cfg.depths:
        raise ValueError(f"{path} holds heads for {cfg.depths} rows above; asked for head_depths={depths}: lower "
                         f"head_depths to at most {cfg.depths}")
    heads = SpatialHeads(SpatialConfig(cfg.hidden_size, depths, cfg.taps))
    heads.load_state_dict({"weight": tensors["weight"][:depths], "bias": tensors["bias"][:depths]})
    return heads
