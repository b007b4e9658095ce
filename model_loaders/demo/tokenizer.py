"""The demo model's image tokenizer: a k-means codebook over 4x4 RGB patches.

A 64x64 image becomes a 16x16 grid of codes (one per patch) and back. We chose k-means over a
learned VQ-VAE because it trains in seconds on a CPU, is exactly reproducible, and on this data
reconstructs about as well as a small VQ-VAE would. The product decodes only; fitting and encoding (and the PSNR
that tooling/train_demo.py and the tooling tests measure) are the maintainers' tooling/demo_data.py.
"""
from __future__ import annotations

import numpy as np
import torch

PATCH = 4


def unpatch(p: torch.Tensor) -> np.ndarray:
    n, gh, gw, _ = p.shape
    x = p.view(n, gh, gw, PATCH, PATCH, 3).permute(0, 1, 3, 2, 4, 5).reshape(n, gh * PATCH, gw * PATCH, 3)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).numpy()


class PatchCodebook:
    def __init__(self, centroids: torch.Tensor):
        self.centroids = centroids.float()  # [K, 48]

    @property
    def size(self) -> int:
        return self.centroids.shape[0]

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """LongTensor [n, 16, 16] -> uint8 [n, 64, 64, 3]."""
        return unpatch(self.centroids[codes.long().cpu()])
