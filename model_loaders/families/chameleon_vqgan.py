"""The pixel decoder of Meta's Chameleon image tokenizer (a taming-transformers VQGAN), used by
Anole and Lumina-mGPT. transformers' `ChameleonVQVAE` ships only the encoder, so the decoder is
built here from the tokenizer's own ``vqgan.yaml`` (``model.params``: ``embed_dim``, ``n_embed``,
``ddconfig``) and loaded from ``vqgan.safetensors`` or ``vqgan.ckpt`` (``state_dict``, opened with
``weights_only=True``; encoder and loss weights in the file are ignored). Parameter names are the checkpoint's.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from ..files.checkpoints import load_into, load_state_dict
from .vq_blocks import AttnBlock, DecoderLevel, ResnetBlock, group_norm, swish

CONFIG_FILE = "vqgan.yaml"
WEIGHT_FILES = ("vqgan.safetensors", "vqgan.ckpt")


class _Mid(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)

    def forward(self, h):
        return self.block_2(self.attn_1(self.block_1(h)))


class VQGANDecoder(nn.Module):
    """Codes [B, H, W] -> pixels [B, 3, H * f, W * f] in about [-1, 1], f = 2 ** (levels - 1)."""

    def __init__(self, n_embed: int, embed_dim: int, z_channels: int, ch: int, ch_mult, num_res_blocks: int,
                 resolution: int, attn_resolutions=(), out_ch: int = 3):
        super().__init__()
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        self.downsample = 2 ** (len(ch_mult) - 1)
        dec = self.decoder = nn.Module()
        c = ch * ch_mult[-1]
        res = resolution // self.downsample
        dec.conv_in = nn.Conv2d(z_channels, c, 3, padding=1)
        dec.mid = _Mid(c)
        levels = [None] * len(ch_mult)
        for lvl in reversed(range(len(ch_mult))):  # lowest resolution first; stored by level index
            cout = ch * ch_mult[lvl]
            levels[lvl] = DecoderLevel(c, cout, num_res_blocks + 1, res in attn_resolutions, lvl != 0)
            c = cout
            res = res * 2 if lvl != 0 else res
        dec.up = nn.ModuleList(levels)
        dec.norm_out = group_norm(c)
        dec.conv_out = nn.Conv2d(c, out_ch, 3, padding=1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # [B, embed_dim, H, W]
        d = self.decoder
        h = d.mid(d.conv_in(self.post_quant_conv(z)))
        for lvl in reversed(range(len(d.up))):
            h = d.up[lvl](h)
        return d.conv_out(swish(d.norm_out(h)))


def read_vqgan_config(path: str) -> dict:
    """Decoder arguments from the tokenizer's vqgan.yaml (YAML, read with safe_load; or Emu3.5's config.yaml)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            params = yaml.safe_load(f)
        params = params["model"]["params"] if "model" in params else params  # IBQ's config.yaml: the params only
        dd = params["ddconfig"]
        return dict(n_embed=int(params["n_embed"]), embed_dim=int(params["embed_dim"]),
                    z_channels=int(dd["z_channels"]), ch=int(dd["ch"]), ch_mult=[int(m) for m in dd["ch_mult"]],
                    num_res_blocks=int(dd["num_res_blocks"]), resolution=int(dd["resolution"]),
                    attn_resolutions=[int(r) for r in dd.get("attn_resolutions") or []],
                    out_ch=int(dd.get("out_ch", 3)))
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a VQGAN config ([model.params:] n_embed, embed_dim and "
                         f"ddconfig z_channels / ch / ch_mult / num_res_blocks / resolution): {e!r}") from e


def load_vqgan_decoder(folder: str, device=None, dtype=torch.float32) -> VQGANDecoder:
    """The decoder of `folder`'s Chameleon image tokenizer (vqgan.yaml + vqgan.safetensors or vqgan.ckpt)."""
    cfg_path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(cfg_path):
        raise ValueError(f"image tokenizer config {cfg_path} is missing: copy vqgan.yaml from Chameleon's "
                         f"tokenizer folder (Meta's chameleon release, tokenizer/vqgan.yaml)")
    weights = next((os.path.join(folder, n) for n in WEIGHT_FILES if os.path.isfile(os.path.join(folder, n))), None)
    if weights is None:
        raise ValueError(f"image tokenizer weights {' or '.join(WEIGHT_FILES)} are missing in {folder!r}: copy "
                         f"vqgan.ckpt from Chameleon's tokenizer folder (or its safetensors conversion)")
    dec = VQGANDecoder(**read_vqgan_config(cfg_path))
    state = load_state_dict(weights)
    load_into(dec, state, weights, ignore=("encoder.", "quant_conv.", "loss."))
    return dec.to(device=device, dtype=dtype).eval()
