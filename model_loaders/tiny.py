"""Tiny random-weight models (`tiny_model`): a small Llama-style model implementing the full model contract (prefill
with CFG, chain and tree forwards, commit) over a tiny image vocabulary. The `tiny:` model specs of the commands
(the bench's `flat` regime) and the tests use them; the tests' exact enumeration is tests/support/exactness.py.
"""
from __future__ import annotations

from typing import Union

import torch

from .contract import ImageGeometry
from .llama_decoder import LlamaConfig, LlamaDecoder
from .families.llama_adapter import IMAGE_OFFSET, LlamaImageModel, byte_text_encoder


def tiny_model(vocab_size: int = 4, grid: Union[int, tuple] = (2, 2), seed: int = 0, row_end: bool = False,
               hidden_size: int = 16, num_layers: int = 2, num_heads: int = 2, logit_scale: float = 3.0,
               device: str = "cpu") -> LlamaImageModel:
    """A random-weight Llama-style AR image model: `vocab_size` image codes on a `grid`
    (int or (height, width)), optionally a forced row-end token after each row. Any short
    string is a valid prompt (one token per UTF-8 byte). `logit_scale` sharpens the random
    output head so that next-token distributions are far from uniform."""
    h, w = (grid, grid) if isinstance(grid, int) else grid
    geometry = ImageGeometry(height=h, width=w, vocab_size=vocab_size, row_end=row_end)
    text_offset = IMAGE_OFFSET + vocab_size
    cfg = LlamaConfig(vocab_size=text_offset + 256, hidden_size=hidden_size, num_layers=num_layers,
                      num_heads=num_heads, max_positions=512)
    g = torch.Generator().manual_seed(seed)
    dec = LlamaDecoder(cfg)
    with torch.no_grad():
        for name, prm in dec.named_parameters():
            if prm.dim() == 1:  # norm weights stay at 1
                continue
            std = 1.0 if name.startswith("embed") else prm.shape[-1] ** -0.5
            prm.copy_(torch.randn(prm.shape, generator=g) * std)
        dec.lm_head.weight.mul_(logit_scale)
    model = LlamaImageModel(dec.to(device), geometry, byte_text_encoder(text_offset), name=f"tiny-v{vocab_size}-{h}x{w}")
    model.default_sampling = {"cfg_scale": 1.0, "top_k": 0}  # 0: no top-k
    model.random_drafter_seed = seed  # trained backends (hawk, adt_tree) run with random-weight drafters
    return model
