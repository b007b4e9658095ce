"""The EAGLE drafter network (Li et al.): one decoder layer over fc([target feature; next-token embedding]).

Input at sequence position j: ``x_j = fc([f_{j-1}; e(t_j)])`` where ``f_{j-1}`` is the feature
(last hidden state) whose output predicted t_j: the target's own hidden state for committed
positions, the drafter's own output for draft positions. The layer's output ``g_j`` regresses the
target's hidden state at j, and the TARGET's image head (``model.image_logits``) turns it into
logits of position j + 1. With CFG the drafter runs both branches (conditional features and
unconditional ones, same tokens) and the draft distribution is `target_probs` of the two
branches' logits, exactly as the target's.

Context: the layer attends to a band of the last ``window`` positions (training uses the same
band mask), so a drafting step recomputes the window from the stored target features instead of
keeping a KV cache that would need rollback; the tree's nodes then attend to the window and to
their own ancestors (`EagleNet.draft_layer`). Window K/V live in a small static cache per step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from ...model_loaders.llama import Block, LlamaConfig, rope_tables

FORMAT_NAME = "specar-eagle-1"


@dataclass
class EagleConfig:
    hidden_size: int
    num_heads: int
    intermediate_size: int = 0
    window: int = 32  # committed positions the layer attends to (band)
    max_positions: int = 1024

    def llama(self) -> LlamaConfig:
        return LlamaConfig(vocab_size=1, hidden_size=self.hidden_size, num_heads=self.num_heads,
                           intermediate_size=self.intermediate_size, num_layers=1, max_positions=self.max_positions)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def for_model(cls, model, window: Optional[int] = None) -> "EagleConfig":
        D = model.hidden_size
        heads = next(h for h in (6, 4, 3, 2, 1) if D % h == 0 and D // h >= 8) if D >= 8 else 1
        geo = model.geometry
        w = window or max(2 * geo.row_stride, 8)
        return cls(hidden_size=D, num_heads=heads, window=w, max_positions=geo.seq_len + 64)


class EagleNet(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        lc = cfg.llama()
        cfg.intermediate_size = lc.intermediate_size
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True)
        self.block = Block(lc)
        cos, sin = rope_tables(lc)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def expected_shapes(self) -> dict:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}

    def _rope(self, positions):
        positions = positions.clamp(0, self.cfg.max_positions - 1)
        return self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]

    def forward(self, feats, embeds, positions, mask, kv=None, slots=None):
        """feats, embeds [R, T, D]; positions [R, T]; mask [R, T, S] (S == T without cache)."""
        x = self.fc(torch.cat([feats, embeds], -1))
        cos, sin = self._rope(positions)
        return self.block(x, cos, sin, kv, slots, mask)

    def band_mask(self, T: int, device) -> torch.Tensor:
        """Teacher-forced training mask: causal, last `window` positions only."""
        i = torch.arange(T, device=device)
        d = i[:, None] - i[None, :]
        return (d >= 0) & (d < self.cfg.window)

    def new_cache(self, rows: int, slots: int, device, dtype):
        h = self.cfg.num_heads
        shape = (rows, h, slots, self.cfg.hidden_size // h)
        return (torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))


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


__all__ = ["EagleConfig", "EagleNet", "random_eagle", "FORMAT_NAME"]
