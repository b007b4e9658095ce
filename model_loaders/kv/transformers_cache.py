"""`SlotCache`: the slot KV cache (store.py) as a transformers ``Cache``, whose ``update`` writes the new
keys / values of every row at that row's own slots (set before each forward) and returns the whole static
tensors. Each layer is allocated at its first write, on the device and with the heads its keys have (a
model split over devices by accelerate). Imported when an adapter builds its first cache, so that listing
the model families needs no transformers."""
from __future__ import annotations

import torch

from .store import empty_layer, gather_slots, write_slots

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
        self.keys, self.values = empty_layer(R, H, self.owner.capacity, hd, key_states.dtype, key_states.device,
                                             value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return write_slots((self.keys, self.values), key_states.transpose(1, 2), value_states.transpose(1, 2),
                           *self.owner.slots_and_rows(key_states.device))

    def get_mask_sizes(self, query_length):
        return self.owner.capacity, 0

    def get_seq_length(self):
        return 0  # positions always come from explicit position_ids

    def get_max_length(self):
        return self.owner.capacity

    def get_max_cache_shape(self):  # abstract in transformers 4.5x's CacheLayerMixin
        return self.owner.capacity


class SlotCache(Cache):
    """A transformers ``Cache`` over preallocated per-row slots (see the module docstring)."""

    def __init__(self, num_layers: int, capacity: int):
        self.capacity = capacity
        self._slots_on = {}  # device -> (slots [R, T], rows [R, 1]) of this forward there
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def set_slots(self, slots: torch.Tensor):
        """The slots of the next forward's tokens (once per forward; each layer's device gets its copy once)."""
        self.slots, self._slots_on = slots, {}

    def slots_and_rows(self, device):
        if device not in self._slots_on:
            s = self.slots.to(device)
            self._slots_on[device] = (s, torch.arange(s.shape[0], device=device)[:, None])
        return self._slots_on[device]

    def gather(self, rows, dst, src):
        gather_slots([(layer.keys, layer.values) for layer in self.layers if layer.is_initialized], rows, dst, src)

    # transformers queries these on some code paths; a slot cache has no single "length"
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.capacity

