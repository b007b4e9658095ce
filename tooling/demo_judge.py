"""An automatic check that a demo image follows its prompt: named shape, its colour, background.

- colours: every pixel is assigned the nearest of the 8 palette colours (a striped shape's dark
  stripes are the shape colour at 35% brightness, so they count as the shape colour too); the
  background is right when it is the most common colour of the 4-pixel border, the shape colour
  is right when at least 2% of the image has it;
- shape: the mask of shape-coloured pixels is cropped to its bounding box, resized to 16x16 and
  classified by a small logistic regression trained on procedural scenes (our own data).
"""
from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F

from ..model_loaders.demo.data import COLOURS, SHAPES
from .demo_data import dataset

_NAMES = list(COLOURS)
_PALETTE = torch.tensor([COLOURS[n] for n in _NAMES], dtype=torch.float32)
_PALETTE = torch.cat([_PALETTE, _PALETTE * 0.35])  # bright and striped-dark versions


def colour_map(image: np.ndarray) -> torch.Tensor:
    """[H, W] index into the 8 colour names of each pixel's nearest palette colour."""
    x = torch.from_numpy(np.array(image, dtype=np.float32)).reshape(-1, 3)
    d = torch.cdist(x, _PALETTE)
    # a dark stripe must not be mistaken for black and vice versa: black's dark twin is black
    return (d.argmin(-1) % len(_NAMES)).view(image.shape[0], image.shape[1])


def mask_features(mask: torch.Tensor, size: int = 16) -> torch.Tensor:
    ys, xs = torch.nonzero(mask, as_tuple=True)
    if ys.numel() == 0:
        return torch.zeros(size * size)
    crop = mask[ys.min():ys.max() + 1, xs.min():xs.max() + 1].float()
    side = max(crop.shape)  # keep the aspect ratio: pad to a square
    sq = torch.zeros(side, side)
    oy, ox = (side - crop.shape[0]) // 2, (side - crop.shape[1]) // 2
    sq[oy:oy + crop.shape[0], ox:ox + crop.shape[1]] = crop
    return F.interpolate(sq[None, None], size=(size, size), mode="area").flatten()


class PromptJudge:
    def __init__(self, train_images: int = 3000, seed: int = 123):
        images, _, scenes = dataset(train_images, seed=seed)
        feats, labels = [], []
        for img, sc in zip(images, scenes):
            cm = colour_map(img)
            feats.append(mask_features(cm == _NAMES.index(sc["colour"])))
            labels.append(SHAPES.index(sc["shape"]))
        x, y = torch.stack(feats), torch.tensor(labels)
        self.w = torch.zeros(x.shape[1], len(SHAPES), requires_grad=True)
        self.b = torch.zeros(len(SHAPES), requires_grad=True)
        opt = torch.optim.Adam([self.w, self.b], lr=0.05)
        for _ in range(300):
            loss = F.cross_entropy(x @ self.w + self.b, y) + 1e-4 * (self.w ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            self.train_accuracy = float(((x @ self.w + self.b).argmax(-1) == y).float().mean())

    @staticmethod
    def parse(prompt: str) -> dict:
        words = re.findall(r"[a-z]+", prompt.lower())
        shape = next((w for w in words if w in SHAPES), None)
        colours = [w for w in words if w in COLOURS]
        return {"shape": shape, "colour": colours[0] if colours else None,
                "background": colours[1] if len(colours) > 1 else None}

    def judge(self, image, prompt: str) -> dict:
        want = self.parse(prompt)
        cm = colour_map(np.asarray(image))
        border = torch.cat([cm[:4].flatten(), cm[-4:].flatten(), cm[:, :4].flatten(), cm[:, -4:].flatten()])
        bg = _NAMES[int(torch.bincount(border, minlength=len(_NAMES)).argmax())]
        fg_mask = cm == _NAMES.index(want["colour"]) if want["colour"] else torch.zeros_like(cm, dtype=torch.bool)
        with torch.no_grad():
            shape = SHAPES[int((mask_features(fg_mask) @ self.w + self.b).argmax())]
        result = {
            "background_ok": want["background"] is None or bg == want["background"],
            "colour_ok": bool(fg_mask.float().mean() >= 0.02),
            "shape_ok": want["shape"] is None or shape == want["shape"],
            "seen": {"background": bg, "shape": shape, "colour_fraction": round(float(fg_mask.float().mean()), 3)},
        }
        result["ok"] = result["background_ok"] and result["colour_ok"] and result["shape_ok"]
        return result


# the fixed prompt set of the README's prompt-following figure
JUDGE_PROMPTS = [
    f"a {size} {colour} {shape} on a {noisy}{bg} background"
    for size, colour, shape, noisy, bg in [
        ("large", "red", "circle", "", "blue"), ("large", "yellow", "square", "", "purple"),
        ("large", "white", "triangle", "", "green"), ("large", "orange", "star", "", "black"),
        ("small", "blue", "circle", "", "yellow"), ("small", "green", "square", "", "white"),
        ("small", "purple", "triangle", "", "orange"), ("small", "red", "star", "", "white"),
        ("large", "green", "circle", "noisy ", "red"), ("large", "blue", "square", "noisy ", "orange"),
        ("large", "black", "triangle", "noisy ", "yellow"), ("large", "white", "star", "noisy ", "blue"),
        ("large", "yellow", "circle", "noisy ", "black"), ("large", "purple", "square", "noisy ", "green"),
        ("large", "red", "triangle", "noisy ", "white"), ("large", "green", "star", "noisy ", "purple"),
    ]
]
