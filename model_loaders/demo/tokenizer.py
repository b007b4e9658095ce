"""The demo model's image tokenizer: a k-means codebook over 4x4 RGB patches.

A 64x64 image becomes a 16x16 grid of codes (one per patch) and back. We chose k-means over a
learned VQ-VAE because it trains in seconds on a CPU, is exactly reproducible, and on this data
reconstructs about as well as a small VQ-VAE would (PSNR is measured by `train.py` and the tests).
"""
from __future__ import annotations

import numpy as np
import torch

PATCH = 4


def patches(images: np.ndarray) -> torch.Tensor:
    """uint8 [n, H, W, 3] -> float [n, H/4, W/4, 48] in 0..1."""
    x = torch.as_tensor(images).float() / 255.0
    n, h, w, c = x.shape
    x = x.view(n, h // PATCH, PATCH, w // PATCH, PATCH, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h // PATCH, w // PATCH, PATCH * PATCH * c)


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

    @classmethod
    def fit(cls, images: np.ndarray, codes: int = 1024, iters: int = 20, sample: int = 300_000, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        x = patches(images).reshape(-1, PATCH * PATCH * 3)
        if x.shape[0] > sample:
            x = x[torch.randperm(x.shape[0], generator=g)[:sample]]
        c = x[torch.randperm(x.shape[0], generator=g)[:codes]].clone()
        for _ in range(iters):
            assign = cls(c)._nearest(x)
            sums = torch.zeros_like(c).index_add_(0, assign, x)
            counts = torch.bincount(assign, minlength=codes).float()
            empty = counts == 0
            c = torch.where(empty[:, None], c, sums / counts.clamp(min=1)[:, None])
            if empty.any():  # re-seed dead codes on random patches
                c[empty] = x[torch.randint(x.shape[0], (int(empty.sum()),), generator=g)]
        return cls(c)

    def _nearest(self, x: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
        c2 = (self.centroids ** 2).sum(-1)
        out = []
        for s in range(0, x.shape[0], chunk):
            xs = x[s:s + chunk]
            out.append((c2[None] - 2 * xs @ self.centroids.T).argmin(-1))
        return torch.cat(out)

    def encode(self, images: np.ndarray) -> torch.Tensor:
        """uint8 [n, 64, 64, 3] -> LongTensor [n, 16, 16]."""
        p = patches(images)
        n, gh, gw, d = p.shape
        return self._nearest(p.reshape(-1, d)).view(n, gh, gw)

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """LongTensor [n, 16, 16] -> uint8 [n, 64, 64, 3]."""
        return unpatch(self.centroids[codes.long().cpu()])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / max(mse, 1e-12)))
