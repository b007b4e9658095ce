"""A small Llama-style decoder over the slot KV cache (kv/store.py).

Used by the tiny test models and the embedded demo model (and, one block of it, by the EAGLE
drafter). A forward writes its keys/values at given slots and attends under an explicit boolean
mask, so draft trees, rollback and per-row prefix lengths all come for free.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kv.store import attend, empty_layer, write_slots


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 0  # 0: 8/3 * hidden rounded to a multiple of 8
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_positions: int = 4096

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if not self.intermediate_size:
            self.intermediate_size = int(math.ceil(self.hidden_size * 8 / 3 / 8) * 8)

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_tables(cfg: LlamaConfig, device=None):
    hd = cfg.hidden_size // cfg.num_heads
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    t = torch.arange(cfg.max_positions, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    freqs = torch.cat([freqs, freqs], dim=-1)  # [max_positions, hd]
    return torch.cos(freqs), torch.sin(freqs)


def apply_rope(x, cos, sin):
    # x [R, H, T, hd]; cos/sin [R, 1, T, hd] (rotate-half convention, as transformers' Llama)
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.h = cfg.num_heads
        self.hd = cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.o = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, kv, slots, mask):
        R, T, _ = x.shape
        q, k, v = self.project(x, cos, sin, kv, slots)
        out = attend(q, (k, v), mask)
        return self.o(out.transpose(1, 2).reshape(R, T, -1))

    def project(self, x, cos, sin, kv=None, slots=None):
        """q, k, v [R, H, T, hd] of x [R, T, D] after the rotary; with a static cache [R, H, S, hd]
        the new keys / values are written at `slots` [R, T] and k, v are the whole cache."""
        R, T, _ = x.shape
        q, k, v = self.qkv(x).view(R, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)  # [R, H, T, hd] each
        q, k = self.pre_rope(q, k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None:  # static cache [R, H, S, hd]: write by slot, attend over all slots
            k, v = write_slots(kv, k.transpose(1, 2), v.transpose(1, 2), slots)
        return q, k, v

    def pre_rope(self, q, k):
        """What a variant does to q and k [R, H, T, hd] before the rotary (Llama: nothing)."""
        return q, k


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, kv, slots, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, kv, slots, mask)
        g, u = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class LlamaDecoder(nn.Module):
    """Token embedding -> blocks -> final norm -> LM head."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def new_cache(self, rows: int, capacity: int) -> list:
        """One `empty_layer` per block: a plain list, not a `SlotKV`, so that the CUDA-graph path's walk over
        the step's state (capture.tensor_paths, 4 levels) reaches it and its tensors get buffer homes."""
        cfg, w = self.cfg, self.embed.weight
        hd = cfg.hidden_size // cfg.num_heads
        return [empty_layer(rows, cfg.num_heads, capacity, hd, w.dtype, w.device) for _ in range(cfg.num_layers)]

    def hidden_states(self, tokens, positions, mask, cache=None, slots=None, embeds=None):
        """tokens/positions [R, T]; mask [R, T, S] bool (True = attend); cache from `new_cache`
        with `slots` [R, T] where the new keys/values are written (None: no cache, S == T).
        ``embeds`` [R, T, D] replaces the token embedding (then `tokens` is ignored)."""
        x = self.embed(tokens) if embeds is None else embeds
        cos, sin = self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]  # [R, 1, T, hd]
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, None if cache is None else cache[i], slots, mask)
        return self.norm(x)

    def forward(self, tokens, positions=None, mask=None):
        """Teacher-forced logits for whole sequences [R, T] (training and enumeration)."""
        R, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(R, T)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril().expand(R, T, T)
        return self.lm_head(self.hidden_states(tokens, positions, mask))
