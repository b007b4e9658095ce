"""LlamaGen's image tokenizer decoder (VQ-16: 16x downsampling, 16384 codes of dimension 8,
l2-normalised codebook), our own implementation with the authors' parameter names so their
released ``vq_ds16_c2i.pt`` / ``vq_ds16_t2i.pt`` (weights under ``model``) load unchanged (levels lowest resolution
first; attention in the first level only).

The architecture is read off the checkpoint's tensor shapes (levels, widths, residual blocks per
level, codebook size and dimension), so VQ-8 and VQ-16 checkpoints both load.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from ..files.checkpoints import load_into, load_state_dict
from .vq_blocks import AttnBlock, DecoderLevel, ResnetBlock, group_norm, swish


class LlamaGenVQDecoder(nn.Module):
    """Codes [B, H, W] -> pixels [B, 3, H * f, W * f] in about [-1, 1]."""

    def __init__(self, codebook_size: int, codebook_dim: int, z_channels: int, widths, blocks_per_level: int,
                 l2_norm: bool = True):
        super().__init__()
        self.l2_norm = l2_norm
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(codebook_size, codebook_dim)
        self.post_quant_conv = nn.Conv2d(codebook_dim, z_channels, 1)
        self.downsample = 2 ** (len(widths) - 1)
        d = self.decoder = nn.Module()
        c = widths[0]  # widths: per decoder level, lowest resolution first
        d.conv_in = nn.Conv2d(z_channels, c, 3, padding=1)
        d.mid = nn.ModuleList([ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)])
        levels = []
        for i, w in enumerate(widths):
            levels.append(DecoderLevel(c, w, blocks_per_level, attn=i == 0, upsample=i != len(widths) - 1,
                                       blocks="res"))
            c = w
        d.conv_blocks = nn.ModuleList(levels)
        d.norm_out = group_norm(c)
        d.conv_out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        table = self.quantize.embedding.weight
        if self.l2_norm:  # LlamaGen looks codes up in the l2-normalised codebook
            table = F.normalize(table, p=2, dim=-1)
        z = table[codes].permute(0, 3, 1, 2)
        d = self.decoder
        h = d.conv_in(self.post_quant_conv(z))
        for m in d.mid:
            h = m(h)
        for lvl in d.conv_blocks:
            h = lvl(h)
        return d.conv_out(swish(d.norm_out(h)))


def decoder_args(state: dict, path: str) -> dict:
    """Constructor arguments read off a checkpoint's tensor shapes."""
    try:
        n, dim = state["quantize.embedding.weight"].shape
        z = state["post_quant_conv.weight"].shape[0]
        levels = sorted({int(m.group(1)) for k in state if (m := re.match(r"decoder\.conv_blocks\.(\d+)\.", k))})
        widths = [int(state[f"decoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0]) for i in levels]
        blocks = len({k.split(".")[4] for k in state if k.startswith("decoder.conv_blocks.0.res.")})
    except (KeyError, AttributeError, ValueError) as e:
        raise ValueError(f"{path} is not a LlamaGen VQ tokenizer checkpoint (expected quantize.embedding, "
                         f"post_quant_conv and decoder.conv_blocks.* weights): missing {e}") from e
    if not levels or levels != list(range(len(levels))):
        raise ValueError(f"{path}: decoder.conv_blocks levels {levels} are not 0..L-1")
    return dict(codebook_size=int(n), codebook_dim=int(dim), z_channels=int(z), widths=widths, blocks_per_level=blocks)


def load_llamagen_vq(path: str, device=None, l2_norm: bool = True) -> LlamaGenVQDecoder:
    state = load_state_dict(path)
    dec = LlamaGenVQDecoder(**decoder_args(state, path), l2_norm=l2_norm)
    load_into(dec, state, path, ignore=("encoder.", "quant_conv.", "quantize.codebook_used"))
    return dec.to(device).eval()
