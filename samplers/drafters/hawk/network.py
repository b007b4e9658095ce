"""Hawk's draft heads: horizontal heads (positions T+1..T+n) and vertical heads (rows below), and
their files (samplers/drafters/hawk/drafter.py drafts with them; training/hawk.py trains them)."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ....model_loaders.files.drafter_files import (WEIGHTS_FILE, check_shapes, drafter_folder, load_heads_config,
                                                   use_random_drafter)

KIND = "hawk"  # drafter.json's kind
FOLDER = "hawk_heads"  # beside the model's weights


@dataclass
class HawkConfig:
    hidden_size: int
    horizontal_heads: int = 4
    vertical_depth: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


class HawkHeads(nn.Module):
    """Residual SiLU blocks: horizontal heads 0..n-1, vertical heads 0..v-1 (depth d = index + 1)."""

    def __init__(self, cfg: HawkConfig):
        super().__init__()
        self.cfg = cfg
        D, n, v = cfg.hidden_size, cfg.horizontal_heads, cfg.vertical_depth
        # zero init: every head starts as the identity (the target's own next-token head)
        self.h_weight = nn.Parameter(torch.zeros(n, D, D))
        self.h_bias = nn.Parameter(torch.zeros(n, D))
        self.v_weight = nn.Parameter(torch.zeros(v, D, D))
        self.v_bias = nn.Parameter(torch.zeros(v, D))

    def expected_shapes(self) -> dict:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}

    @staticmethod
    def _block(h, w, b):
        """h [..., H, D] with per-head w [H, D, D], b [H, D] -> h + SiLU(W h + b)."""
        return h + torch.nn.functional.silu(torch.einsum("...hi,hoi->...ho", h, w) + b)

    def horizontal(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., D] -> features [..., n, D] of positions T + 1 .. T + n."""
        n = self.h_weight.shape[0]
        return self._block(h.unsqueeze(-2).expand(*h.shape[:-1], n, h.shape[-1]), self.h_weight, self.h_bias)

    def vertical(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., v, D] (source state of depth d at index d - 1) -> features [..., v, D]."""
        return self._block(h, self.v_weight, self.v_bias)


def random_heads(cfg: HawkConfig, seed: int) -> HawkHeads:
    """Random-weight heads (tiny test models: no files); head i's weights do not depend on how many
    heads there are."""
    heads = HawkHeads(cfg)
    D = cfg.hidden_size
    with torch.no_grad():
        for name, w, b in (("h", heads.h_weight, heads.h_bias), ("v", heads.v_weight, heads.v_bias)):
            for i in range(w.shape[0]):
                g = torch.Generator().manual_seed(int(seed) * 1000 + (17 if name == "h" else 53) * (i + 1))
                w[i] = torch.randn(D, D, generator=g) * 2.0 * D ** -0.5
                b[i] = torch.randn(D, generator=g) * 0.5
    return heads


def load_heads(model, horizontal: int, vertical: int, folder: str = "") -> HawkHeads:
    """The model's Hawk heads (the first `horizontal` / `vertical` of the file): `folder` (or
    <model folder>/hawk_heads); random-weight heads for tiny test models (random_drafter_seed);
    else the ValueError naming the training command."""
    path = folder or drafter_folder(model, FOLDER)
    if use_random_drafter(model, folder, path):
        return random_heads(HawkConfig(model.hidden_size, horizontal, vertical), model.random_drafter_seed)
    tensors, cfg = load_heads_config(path, KIND, model, HawkConfig, "Hawk", beside=FOLDER)
    full = HawkHeads(cfg)
    check_shapes(os.path.join(path, WEIGHTS_FILE), tensors, full.expected_shapes())
    if horizontal > cfg.horizontal_heads or vertical > cfg.vertical_depth:
        raise ValueError(f"{path} holds {cfg.horizontal_heads} horizontal and {cfg.vertical_depth} vertical heads; "
                         f"asked for horizontal_heads={horizontal}, vertical_depth={vertical}: lower them or "
                         f"retrain with more heads")
    heads = HawkHeads(HawkConfig(cfg.hidden_size, horizontal, vertical))
    heads.load_state_dict({"h_weight": tensors["h_weight"][:horizontal], "h_bias": tensors["h_bias"][:horizontal],
                           "v_weight": tensors["v_weight"][:vertical], "v_bias": tensors["v_bias"][:vertical]})
    return heads


__all__ = ["HawkConfig", "HawkHeads", "load_heads", "random_heads", "KIND", "FOLDER"]
