"""Lumina-mGPT 2.0's image tokenizer decoder: MoVQGAN (ai-forever/MoVQGAN, the 270M model
``movqgan_270M.ckpt``), our own implementation with the checkpoint's parameter names so the
released file loads unchanged.

MoVQGAN is a VQGAN whose decoder normalises with *spatial* norms: every GroupNorm output is
scaled and shifted per pixel by 1x1 convolutions (``conv_y``, ``conv_b``) of the quantized codes
``zq`` resized (nearest) to the feature map, so the codes condition every decoder block, not only
its input. The 270M model: 16384 codes of dimension 4, 8x downsampling (``ch_mult`` 1, 2, 2, 4;
widths 256, 512, 512, 1024), 3 ResNet blocks per level, attention in the middle block and in the
lowest-resolution level; no l2 normalisation of the codebook.

The architecture is read off the tensor shapes (levels, widths, blocks per level, which levels attend, codebook
size and dimension). Encoder, quant_conv and training-only weights in the file are ignored.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from ..files.checkpoints import load_into, load_state_dict
from .vq_blocks import group_norm, swish

IGNORED = ("encoder.", "quant_conv.", "loss.", "ema_", "quantize.codebook_used")


class SpatialNorm(nn.Module):
    """GroupNorm(f) * conv_y(zq) + conv_b(zq), zq resized (nearest) to f's grid."""

    def __init__(self, channels: int, zq_channels: int):
        super().__init__()
        self.norm_layer = group_norm(channels)
        self.conv_y = nn.Conv2d(zq_channels, channels, 1)
        self.conv_b = nn.Conv2d(zq_channels, channels, 1)

    def forward(self, f, zq):
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, zq: int):
        super().__init__()
        self.norm1 = SpatialNorm(cin, zq)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = SpatialNorm(cout, zq)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:  # 1x1 projection of the skip path when the width changes
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x, zq):
        h = self.conv1(swish(self.norm1(x, zq)))
        h = self.conv2(swish(self.norm2(h, zq)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """One-head self-attention over all positions, after a spatial norm."""

    def __init__(self, c: int, zq: int):
        super().__init__()
        self.norm = SpatialNorm(c, zq)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x, zq):
        B, C, H, W = x.shape
        h = self.norm(x, zq)
        q, k, v = (m(h).reshape(B, C, H * W).transpose(1, 2) for m in (self.q, self.k, self.v))
        w = torch.softmax(q @ k.transpose(1, 2) * C ** -0.5, dim=-1)
        return x + self.proj_out((w @ v).transpose(1, 2).reshape(B, C, H, W))


class Level(nn.Module):
    def __init__(self, cin, cout, n_blocks, attn: bool, upsample: bool, zq: int):
        super().__init__()
        self.block = nn.ModuleList(ResBlock(cin if i == 0 else cout, cout, zq) for i in range(n_blocks))
        self.attn = nn.ModuleList(AttnBlock(cout, zq) for _ in range(n_blocks if attn else 0))
        if upsample:
            self.upsample = nn.Module()
            self.upsample.conv = nn.Conv2d(cout, cout, 3, padding=1)

    def forward(self, h, zq):
        for i, blk in enumerate(self.block):
            h = blk(h, zq)
            if len(self.attn):
                h = self.attn[i](h, zq)
        if hasattr(self, "upsample"):
            h = self.upsample.conv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return h


class MoVQDecoder(nn.Module):
    """Codes [B, H, W] -> pixels [B, 3, H * f, W * f] in about [-1, 1], f = 2 ** (levels - 1)."""

    def __init__(self, n_embed: int, embed_dim: int, z_channels: int, widths, n_blocks: int, attn_levels=()):
        super().__init__()
        # widths: per level, highest resolution first (level 0 is the output level, as the checkpoint numbers them)
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        self.downsample = 2 ** (len(widths) - 1)
        d = self.decoder = nn.Module()
        c = widths[-1]
        d.conv_in = nn.Conv2d(z_channels, c, 3, padding=1)
        d.mid = nn.Module()
        d.mid.block_1, d.mid.attn_1, d.mid.block_2 = ResBlock(c, c, embed_dim), AttnBlock(c, embed_dim), \
            ResBlock(c, c, embed_dim)
        levels = [None] * len(widths)
        for lvl in reversed(range(len(widths))):  # lowest resolution first
            levels[lvl] = Level(c, widths[lvl], n_blocks, lvl in attn_levels, lvl != 0, embed_dim)
            c = widths[lvl]
        d.up = nn.ModuleList(levels)
        d.norm_out = SpatialNorm(c, embed_dim)
        d.conv_out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        zq = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # [B, embed_dim, H, W]
        d = self.decoder
        h = d.conv_in(self.post_quant_conv(zq))
        h = d.mid.block_2(d.mid.attn_1(d.mid.block_1(h, zq), zq), zq)
        for lvl in reversed(range(len(d.up))):
            h = d.up[lvl](h, zq)
        return d.conv_out(swish(d.norm_out(h, zq)))


def decoder_args(state: dict, path: str) -> dict:
    """Constructor arguments read off a MoVQGAN checkpoint's tensor shapes."""
    try:
        n, dim = state["quantize.embedding.weight"].shape
        z = state["post_quant_conv.weight"].shape[0]
        levels = sorted({int(m.group(1)) for k in state if (m := re.match(r"decoder\.up\.(\d+)\.block\.", k))})
        widths = [int(state[f"decoder.up.{i}.block.0.conv1.weight"].shape[0]) for i in levels]
        blocks = len({k.split(".")[4] for k in state if k.startswith("decoder.up.0.block.")})
        attn = [i for i in levels if f"decoder.up.{i}.attn.0.q.weight" in state]
        state["decoder.norm_out.conv_y.weight"]  # noqa: B018 - a spatial-norm decoder (MoVQ), not a plain VQGAN
    except (KeyError, AttributeError, ValueError) as e:
        raise ValueError(f"{path} is not a MoVQGAN image tokenizer checkpoint (expected quantize.embedding, "
                         f"post_quant_conv, decoder.up.* and spatial-norm decoder.norm_out.conv_y weights): "
                         f"missing {e}") from e
    if not levels or levels != list(range(len(levels))):
        raise ValueError(f"{path}: decoder.up levels {levels} are not 0..L-1")
    return dict(n_embed=int(n), embed_dim=int(dim), z_channels=int(z), widths=widths, n_blocks=blocks,
                attn_levels=tuple(attn))


def load_movqgan(path: str, device=None, dtype=torch.float32) -> MoVQDecoder:
    """The decoder of a MoVQGAN checkpoint (`.ckpt` / `.pt` opened with weights_only=True, the
    weights at the top level or under ``state_dict``; or its safetensors conversion)."""
    state = load_state_dict(path)
    dec = MoVQDecoder(**decoder_args(state, path))
    load_into(dec, state, path, ignore=IGNORED)
    return dec.to(device=device, dtype=dtype).eval()
