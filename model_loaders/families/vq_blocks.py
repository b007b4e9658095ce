"""Convolutional building blocks of the VQGAN-style image decoders (Chameleon's image tokenizer,
LlamaGen's VQ-16): group-normalised residual blocks, single-head spatial self-attention and
nearest-neighbour 2x upsampling. Parameter names follow the checkpoints (norm1, conv1, q, k, v,
proj_out, nin_shortcut, conv) so that their state dicts load unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def group_norm(channels: int) -> nn.GroupNorm:
    # both tokenizers normalise over 32 groups with eps 1e-6
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


def swish(x):
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = group_norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = group_norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:  # 1x1 projection of the skip path when the width changes
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        skip = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return skip + h


class AttnBlock(nn.Module):
    """One-head self-attention over all spatial positions (1x1 convolutions as projections)."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = group_norm(c)
        self.q = nn.Conv2d(c, c, 1)
        self.k = nn.Conv2d(c, c, 1)
        self.v = nn.Conv2d(c, c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        h = self.norm(x)
        q, k, v = (m(h).reshape(B, C, H * W).transpose(1, 2) for m in (self.q, self.k, self.v))
        w = torch.softmax(q @ k.transpose(1, 2) * C ** -0.5, dim=-1)  # [B, HW (query), HW (key)]
        out = (w @ v).transpose(1, 2).reshape(B, C, H, W)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DecoderLevel(nn.Module):
    """One resolution level of a VQ decoder: `n_blocks` ResNet blocks, each followed by attention
    where the level has it, then an optional 2x upsample. `blocks` is the name the released
    checkpoints give the block list ("block" in Chameleon's VQGAN, "res" in LlamaGen's), so the
    state-dict keys load as they are."""

    def __init__(self, cin, cout, n_blocks, attn: bool, upsample: bool, blocks: str = "block"):
        super().__init__()
        self.blocks_name = blocks
        setattr(self, blocks, nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout) for i in range(n_blocks)))
        self.attn = nn.ModuleList(AttnBlock(cout) for _ in range(n_blocks if attn else 0))
        if upsample:
            self.upsample = Upsample(cout)

    def forward(self, h):
        for i, blk in enumerate(getattr(self, self.blocks_name)):
            h = blk(h)
            if len(self.attn):
                h = self.attn[i](h)
        return self.upsample(h) if hasattr(self, "upsample") else h
