"""`SlotKV`: the static KV cache of every slot-cache adapter, written by index (gpt-fast style).

Each layer's keys and values are preallocated ``[rows, heads, slots, head_dim]``. A forward writes its
tokens' keys / values at their slots (`write_slots`) and attends over the whole layer under the slot
layout's mask (kv/slots.py): rows of a batch hold different committed lengths, rollback is free
(uncommitted slots are masked, and overwritten later) and the shapes never change. Committing a tree path
copies its nodes to consecutive slots (`gather_slots`). Our decoders keep a `SlotKV` (our small Llama, a
plain list of `empty_layer`s: llama_decoder.py says why); the transformers adapters a `SlotCache`
(kv/transformers_cache.py) whose layers use the same functions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def empty_layer(rows: int, heads: int, capacity: int, head_dim: int, dtype, device, value_dim=None) -> tuple:
    """One layer's zeroed (keys [rows, heads, capacity, head_dim], values [.., value_dim or head_dim])."""
    return (torch.zeros(rows, heads, capacity, head_dim, dtype=dtype, device=device),
            torch.zeros(rows, heads, capacity, value_dim or head_dim, dtype=dtype, device=device))


def write_slots(kv: tuple, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, rows=None) -> tuple:
    """Write the keys / values ``[R, T, heads, head_dim]`` of T new tokens at their slots ``slots`` [R, T] in
    one layer's (keys, values) ``[R, heads, S, head_dim]`` (viewed as [R, S, heads, head_dim]); `rows`
    ``[R, 1]`` is ``arange(R)[:, None]``, made here when not given. Returns the layer's pair, to attend
    over as a whole."""
    kc, vc = kv
    if rows is None:
        rows = torch.arange(keys.shape[0], device=keys.device)[:, None]
    kc.permute(0, 2, 1, 3)[rows, slots] = keys.to(kc.dtype)
    vc.permute(0, 2, 1, 3)[rows, slots] = values.to(vc.dtype)
    return kc, vc


def gather_slots(layers, rows: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
    """Keep an accepted path: in every layer's (keys, values), slot ``src`` of each row is copied to slot
    ``dst`` (rows [R, 1], dst / src [R, D]: kv/slots.py `path_moves`), on each tensor's own device (a
    transformers model may be split over devices)."""
    for layer in layers:
        for c in layer:
            d = c.device
            v = c.permute(0, 2, 1, 3)
            v[rows.to(d), dst.to(d)] = v[rows.to(d), src.to(d)]


def attend(q: torch.Tensor, kv: tuple, mask: torch.Tensor) -> torch.Tensor:
    """Attention of queries ``[R, heads, T, head_dim]`` over one layer's whole cache under the boolean mask
    ``[R, T, S]``; a cache with fewer (key / value) heads serves each to ``heads / kv heads`` queries."""
    kc, vc = kv
    rep = q.shape[1] // kc.shape[1]
    if rep > 1:
        kc, vc = kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask[:, None])


class SlotKV:
    """The (keys, values) pairs of a decoder's layers (`layers`), as `empty_layer` makes them."""

    reusable_for_sessions = True  # tensors only: kv/slot_model.reset_cache zeroes them for the next session

    def __init__(self, layers: int, rows: int, heads: int, capacity: int, head_dim: int, dtype, device):
        self.layers = [empty_layer(rows, heads, capacity, head_dim, dtype, device) for _ in range(layers)]

    def gather(self, rows: torch.Tensor, dst: torch.Tensor, src: torch.Tensor) -> None:
        gather_slots(self.layers, rows, dst, src)
