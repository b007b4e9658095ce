"""`SlotCache`: a preallocated static KV cache as a transformers ``Cache``, whose ``update`` writes the new
keys / values of every row at that row's own slots (set before each forward) and returns the whole static
tensors. Rows of a batch therefore hold different committed lengths, rollback is free (uncommitted slots
are masked and later overwritten) and shapes are fixed. Imported when an adapter builds its first cache,
so that listing the model families needs no transformers."""
from __future__ import annotations

import torch

try:  # transformers >= 4.5x: the Cache / layer classes this cache plugs into
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError:  # pragma: no cover - very old transformers
    Cache, CacheLayerMixin = object, object


class SlotLayer(CacheLayerMixin):
    """Static keys/values ``[R, H, S, hd]`` of one layer; ``update`` writes at ``cache.slots``."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "SlotCache"):
        super().__init__()
        self.owner = owner
        self.is_initialized = False  # transformers 4.56's CacheLayerMixin does not set it

    def lazy_initialization(self, key_states, value_states):
        R, H, _, hd = key_states.shape
        S = self.owner.capacity
        self.keys = key_states.new_zeros(R, H, S, hd)
        self.values = value_states.new_zeros(R, H, S, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.slots_on(key_states.device)  # [R, T]
        rows = self.owner.rows_on(key_states.device)  # [R, 1]
        # [R, H, S, hd] viewed as [R, S, H, hd]: row r's node t goes to slot slots[r, t]
        self.keys.permute(0, 2, 1, 3)[rows, slots] = key_states.permute(0, 2, 1, 3).to(self.keys.dtype)
        self.values.permute(0, 2, 1, 3)[rows, slots] = value_states.permute(0, 2, 1, 3).to(self.values.dtype)
        return self.keys, self.values

    def get_mask_sizes(self, query_length):
        return self.owner.capacity, 0

    def get_seq_length(self):
        return 0  # positions always come from explicit position_ids

    def get_max_length(self):
        return self.owner.capacity

    def get_max_cache_shape(self):  # abstract in transformers 4.5x's CacheLayerMixin
        return self.owner.capacity

    def gather(self, rows, dst, src):
        for c in (self.keys, self.values):
            if c is None:
                continue
            v = c.permute(0, 2, 1, 3)
            d = c.device
            v[rows.to(d), dst.to(d)] = v[rows.to(d), src.to(d)]


class SlotCache(Cache):
    """A transformers ``Cache`` over preallocated per-row slots (see the module docstring)."""

    def __init__(self, num_layers: int, rows: int, capacity: int):
        self.capacity = capacity
        self.n_rows = rows
        self.slots = None
        self._dev_cache = {}
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def set_slots(self, slots: torch.Tensor):
        self.slots = slots
        self._dev_cache = {slots.device: (slots, torch.arange(slots.shape[0], device=slots.device)[:, None])}

    def _on(self, device):
        if device not in self._dev_cache:
            s = self.slots.to(device)
            self._dev_cache[device] = (s, torch.arange(s.shape[0], device=device)[:, None])
        return self._dev_cache[device]

    def slots_on(self, device):
        return self._on(device)[0]

    def rows_on(self, device):
        return self._on(device)[1]

    def gather(self, rows, dst, src):
        for layer in self.layers:
            layer.gather(rows, dst, src)

    # transformers queries these on some code paths; a slot cache has no single "length"
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.capacity

