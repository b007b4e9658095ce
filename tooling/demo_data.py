"""The demo model's training side (the product only decodes): its procedural images (the scenes of
model_loaders/demo/data.py rendered), the k-means fit of its patch codebook, encoding images with it, and the
reconstruction PSNR. Used by train_demo.py (the weights from scratch), demo_judge.py and the tooling tests.
"""
from __future__ import annotations

import numpy as np
import torch

from specar.model_loaders.demo.data import COLOURS, SIZE, prompt_of, random_scene
from specar.model_loaders.demo.tokenizer import PATCH, PatchCodebook


def shape_mask(scene: dict) -> np.ndarray:
    """Boolean [64, 64] mask of the shape."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64) + 0.5
    dx, dy, r = xx - scene["cx"], yy - scene["cy"], scene["radius"]
    kind = scene["shape"]
    if kind == "circle":
        return dx * dx + dy * dy <= r * r
    if kind == "square":
        s = r * 0.85
        return (np.abs(dx) <= s) & (np.abs(dy) <= s)
    if kind == "triangle":  # upright equilateral triangle inscribed in the circle of radius r
        top, base = -r, r * 0.5
        half_width = (dy - top) / (base - top) * r * np.sqrt(3) / 2
        return (dy >= top) & (dy <= base) & (np.abs(dx) <= half_width)
    # five-pointed star: radius varies with angle between inner and outer radius
    theta = np.arctan2(dy, dx) + np.pi / 2
    k = (theta / (2 * np.pi / 5)) % 1.0
    tri = np.abs(k - 0.5) * 2  # 1 at points, 0 between them
    radius = r * (0.45 + 0.55 * tri ** 1.5)
    return dx * dx + dy * dy <= radius * radius


def render(scene: dict) -> np.ndarray:
    """uint8 [64, 64, 3] image of a scene."""
    rng = np.random.default_rng(scene["seed"])
    bg = np.array(COLOURS[scene["background"]], dtype=np.float64)
    img = np.broadcast_to(bg, (SIZE, SIZE, 3)).copy()
    if scene["noisy"]:
        img += rng.normal(0, 38, (SIZE, SIZE, 1)) + rng.normal(0, 12, (SIZE, SIZE, 3))
    mask = shape_mask(scene)
    fg = np.array(COLOURS[scene["colour"]], dtype=np.float64)
    fill = np.broadcast_to(fg, (SIZE, SIZE, 3)).copy()
    if scene["striped"]:
        yy, xx = np.mgrid[0:SIZE, 0:SIZE]
        along = np.cos(scene["angle"]) * xx + np.sin(scene["angle"]) * yy
        dark = (along / scene["stripe_period"]) % 1.0 < 0.45
        fill[dark] = fg * 0.35
    img[mask] = fill[mask]
    return np.clip(img, 0, 255).astype(np.uint8)


def dataset(n: int, seed: int = 0):
    """n (image uint8 [n, 64, 64, 3], prompts list, scenes list), deterministic in the seed."""
    rng = np.random.default_rng(seed)
    scenes = [random_scene(rng) for _ in range(n)]
    images = np.stack([render(s) for s in scenes])
    return images, [prompt_of(s) for s in scenes], scenes


def patches(images: np.ndarray) -> torch.Tensor:
    """uint8 [n, H, W, 3] -> float [n, H/4, W/4, 48] in 0..1."""
    x = torch.as_tensor(images).float() / 255.0
    n, h, w, c = x.shape
    x = x.view(n, h // PATCH, PATCH, w // PATCH, PATCH, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h // PATCH, w // PATCH, PATCH * PATCH * c)


def nearest(centroids: torch.Tensor, x: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """The index of each row of x's nearest centroid."""
    c2 = (centroids ** 2).sum(-1)
    out = []
    for s in range(0, x.shape[0], chunk):
        xs = x[s:s + chunk]
        out.append((c2[None] - 2 * xs @ centroids.T).argmin(-1))
    return torch.cat(out)


def fit_codebook(images: np.ndarray, codes: int = 1024, iters: int = 20, sample: int = 300_000,
                 seed: int = 0) -> PatchCodebook:
    g = torch.Generator().manual_seed(seed)
    x = patches(images).reshape(-1, PATCH * PATCH * 3)
    if x.shape[0] > sample:
        x = x[torch.randperm(x.shape[0], generator=g)[:sample]]
    c = x[torch.randperm(x.shape[0], generator=g)[:codes]].clone()
    for _ in range(iters):
        assign = nearest(c, x)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=codes).float()
        empty = counts == 0
        c = torch.where(empty[:, None], c, sums / counts.clamp(min=1)[:, None])
        if empty.any():  # re-seed dead codes on random patches
            c[empty] = x[torch.randint(x.shape[0], (int(empty.sum()),), generator=g)]
    return PatchCodebook(c)


def encode(codebook: PatchCodebook, images: np.ndarray) -> torch.Tensor:
    """uint8 [n, 64, 64, 3] -> LongTensor [n, 16, 16]."""
    p = patches(images)
    n, gh, gw, d = p.shape
    return nearest(codebook.centroids, p.reshape(-1, d)).view(n, gh, gw)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / max(mse, 1e-12)))
