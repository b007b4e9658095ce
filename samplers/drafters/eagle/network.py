"""The EAGLE drafter network (Li et al.): one decoder layer over fc([target feature; next-token embedding]).

Input at position j: ``fc([f_{j-1}; e(t_j)])``, f_{j-1} the feature whose output predicted t_j (the target's
hidden state for committed positions, the drafter's own output inside a tree); the output regresses the target's
hidden state at j, and the TARGET's image head turns it into logits of j + 1 (with CFG both branches, through
`target_probs` as the target's). The layer attends to a band of the last ``attn_band`` positions (training: the
same band mask); ADT-Tree keeps the band's keys / values by position (adt_tree/drafter.py, `_band_pass`).
Variants (EagleConfig; the defaults are our own layer) load LANTERN's drafters (lantern_conversion.py):
``qk_norm`` (Anole's per-head q/k LayerNorm), ``input_norm=False`` (LlamaGen), ``rope_grid`` (LlamaGen's 2D
rotary, zero tables past the grid), ``embed_rows`` (the drafter's own embedding by engine id), ``fc_bias``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

import torch.nn.functional as F

from ....model_loaders.llama_decoder import Attention, Block, LlamaConfig, rope_tables
from ....model_loaders.kv.store import empty_layer

KIND = "eagle"  # drafter.json's kind
FOLDER = "eagle_drafter"  # beside the model's weights


@dataclass
class EagleConfig:
    hidden_size: int
    num_heads: int
    intermediate_size: int = 0
    attn_band: int = 32  # committed positions the layer attends to (older drafter.json files call it "window")
    max_positions: int = 1024
    # variants (LANTERN's released drafters); the defaults are our own layer
    qk_norm: bool = False  # per-head LayerNorm (weight, bias [heads, head_dim]) on q and k (Chameleon)
    input_norm: bool = True  # RMSNorm before attention (LANTERN's LlamaGen layer has none)
    norm_eps: float = 1e-5  # the RMSNorms' epsilon
    rope_theta: float = 10000.0
    rope_grid: int = 0  # > 0: 2D rotary over a rope_grid x rope_grid image (LlamaGen), rotate-half pairs
    embed_rows: int = 0  # > 0: own token embedding [embed_rows, hidden] indexed by engine id; 0: the target's
    fc_bias: bool = True

    def llama(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=1, hidden_size=self.hidden_size, num_heads=self.num_heads,
                           intermediate_size=self.intermediate_size, num_layers=1, max_positions=self.max_positions,
                           rope_theta=self.rope_theta, norm_eps=self.norm_eps)

    def to_dict(self) -> dict:
        """The drafter.json config."""
        return asdict(self)

    @classmethod
    def from_dict(cls, config: dict) -> "EagleConfig":
        """A drafter.json config; older files (the same format 1) name the band "window"."""
        config = dict(config)
        if "window" in config:
            if "attn_band" in config:
                raise ValueError("drafter.json config has both attn_band and its older name window; keep one")
            config["attn_band"] = config.pop("window")
        return cls(**config)

    @classmethod
    def for_model(cls, model, attn_band: Optional[int] = None, intermediate_size: int = 0) -> "EagleConfig":
        D = model.hidden_size
        heads = next(h for h in (6, 4, 3, 2, 1) if D % h == 0 and D // h >= 8) if D >= 8 else 1
        geo = model.geometry
        band = attn_band or max(2 * geo.row_stride, 8)
        return cls(hidden_size=D, num_heads=heads, intermediate_size=intermediate_size or 0, attn_band=band,
                   max_positions=geo.seq_len + 64)


class HeadLayerNorm(nn.Module):
    """Chameleon's q/k norm: LayerNorm statistics over each head's dims (eps 1e-5, no affine in the
    statistics), then that head's own weight and bias [heads, head_dim]."""

    def __init__(self, heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x):  # x [R, H, T, hd]
        y = F.layer_norm(x, x.shape[-1:], eps=1e-5)
        return y * self.weight[:, None] + self.bias[:, None]


class QKNormAttention(Attention):
    """llama.Attention with Chameleon's per-head q/k LayerNorm between the projection and the rotary."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg)
        self.q_norm = HeadLayerNorm(self.h, self.hd)
        self.k_norm = HeadLayerNorm(self.h, self.hd)

    def pre_rope(self, q, k):
        return self.q_norm(q), self.k_norm(k)


def rope_grid_tables(cfg: EagleConfig):
    """LlamaGen's 2D rotary as rotate-half tables [max_positions, head_dim]: position j < G^2 is grid
    cell j (row j // G on the first quarter of the frequencies' pairs, column j % G on the second),
    later positions zero (LANTERN pads its table with zero rows). The pairs are (i, i + head_dim/2)
    instead of LlamaGen's interleaved (2i, 2i + 1): the converter permutes q/k projection rows."""
    hd, G = cfg.hidden_size // cfg.num_heads, cfg.rope_grid
    half = hd // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    f = torch.outer(torch.arange(G).float(), inv)  # [G, hd // 4]
    ang = torch.cat([f[:, None, :].expand(G, G, -1), f[None, :, :].expand(G, G, -1)], -1).flatten(0, 1)
    ang = torch.cat([ang, ang], -1)  # [G^2, hd]
    n = min(G * G, cfg.max_positions)
    cos, sin = torch.zeros(cfg.max_positions, hd), torch.zeros(cfg.max_positions, hd)
    cos[:n], sin[:n] = ang[:n].cos(), ang[:n].sin()
    return cos, sin


class EagleNet(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        lc = cfg.llama()
        cfg.intermediate_size = lc.intermediate_size
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.block = Block(lc)
        if cfg.qk_norm:
            self.block.attn = QKNormAttention(lc)
        if not cfg.input_norm:
            self.block.attn_norm = nn.Identity()
        if cfg.embed_rows:
            self.embed = nn.Embedding(cfg.embed_rows, cfg.hidden_size)
        cos, sin = rope_grid_tables(cfg) if cfg.rope_grid else rope_tables(lc)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def embed_tokens(self, model, tokens):
        """Input embeddings of engine ids: the drafter's own table (embed_rows) or the target's."""
        return self.embed(tokens) if self.cfg.embed_rows else model.embed_tokens(tokens)

    def expected_shapes(self) -> dict:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}

    def _rope(self, positions):
        positions = positions.clamp(0, self.cfg.max_positions - 1)
        return self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]

    def _inputs(self, feats, embeds, positions):
        """The layer's input x [R, T, D] and rotary tables of feats, embeds [R, T, D] at positions [R, T]."""
        return (self.fc(torch.cat([feats, embeds], -1)), *self._rope(positions))

    def forward(self, feats, embeds, positions, mask, kv=None, slots=None):
        """feats, embeds [R, T, D]; positions [R, T]; mask [R, T, S] (S == T without cache)."""
        x, cos, sin = self._inputs(feats, embeds, positions)
        return self.block(x, cos, sin, kv, slots, mask)

    def write_keys_values(self, feats, embeds, positions, kv, slots) -> None:
        """Only the keys / values of positions (written to kv at slots [R, T]), no output: for
        context positions whose own output is not needed (the layer is the only one, so nothing
        above reads it)."""
        x, cos, sin = self._inputs(feats, embeds, positions)
        self.block.attn.project(self.block.attn_norm(x), cos, sin, kv, slots)

    def band_mask(self, T: int, device) -> torch.Tensor:
        """Teacher-forced training mask: causal, last `attn_band` positions only."""
        i = torch.arange(T, device=device)
        d = i[:, None] - i[None, :]
        return (d >= 0) & (d < self.cfg.attn_band)

    def new_cache(self, rows: int, slots: int, device, dtype):
        h = self.cfg.num_heads
        return empty_layer(rows, h, slots, self.cfg.hidden_size // h, dtype, device)


def random_eagle(model, seed: int) -> EagleNet:
    """A random-weight EAGLE layer (tiny test models: no files)."""
    cfg = EagleConfig.for_model(model)
    g = torch.Generator().manual_seed(int(seed) + 7919)
    net = EagleNet(cfg)
    with torch.no_grad():
        for name, prm in net.named_parameters():
            if prm.dim() == 1:
                if name.endswith("bias"):
                    prm.zero_()
                continue
            prm.copy_(torch.randn(prm.shape, generator=g) * prm.shape[-1] ** -0.5)
    return net


__all__ = ["KIND", "FOLDER", "EagleConfig", "EagleNet", "QKNormAttention", "random_eagle", "rope_grid_tables"]
