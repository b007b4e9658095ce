"""A compiled step's buffers under CUDA graphs: static addresses, copies of a replay's outputs, and homes
that keep the same addresses in every generation.

CUDA graph trees record a graph with the addresses of its static inputs (the buffers a step writes in
place: the KV cache, the loop's sequence, a drafter's scratch; model_loaders/capture.py) and re-record it
whenever one of them moves. Every generation allocates its buffers anew, so without homes each graph records
once more per generation, every step of the next generation first checks the old recording's addresses and
fails (the first GPU runs, 2026-11-26: "static input data pointer changed", x255 for AR), and the recordings
pile up in a long session (ComfyUI runs many generations on one loaded model).

The buffers at a graph's static paths in the step's state (`tensor_paths`: root, then field names and keys)
become the homes of those paths when no home is there yet (the generation that compiled the graph). A later
generation's buffer at a home's path, with the home's shape, strides and dtype, moves into the home at its
first compiled step: its values are copied in and the tensor object is re-pointed at the home's storage
(`Tensor.set_`), so every reference to it (the state's fields, the engine's locals) sees the home, and its
own allocation is freed. Nothing moves when that would change what a read sees: a buffer that shares its
storage with another reachable tensor (a view, or a base with views) stays where it is (its graph records
once more, as without homes), and nothing moves while another generation on the model is in flight (both
would write one home).

The caller keeps what it hands out of a generation apart from the homes (the engine returns a copy of the
tokens): the next generation overwrites the homes.
"""
from __future__ import annotations

import torch

from ...model_loaders.capture import is_static_address, map_tensors, mark_static_addresses, uses_graph_buffers


def set_static_addresses(paths: dict, static: set, device) -> None:
    """Before a graph's compile: exactly the tensors at the paths in `static` (of `paths`, path ->
    tensor) are marked static addresses, every other one unmarked. A graph's static inputs are fixed
    when it compiles; a tensor left marked by another plan's step that this plan replaces would move at
    every step, and every step would re-record."""
    if not uses_graph_buffers(device):
        return
    mark_static_addresses([t for p, t in paths.items() if p in static], device)
    for p, t in paths.items():
        if p not in static and is_static_address(t):
            del t._dynamo_static_input_type


def copy_graph_outputs(roots, kept: dict, depth: int = 4):
    """`roots` with every reachable tensor that is not in `kept` (id -> tensor: what existed before
    the compiled step ran) replaced by a copy. On CUDA a graph's outputs live in its CUDA graph's
    memory pool and the next replay overwrites them (CUDA graph trees then refuse to read them: "accessing
    tensor output of CUDAGraphs that has been overwritten"); the loop keeps some across steps (the
    frontier, the drafter's state, the report's per-step counts), so it keeps copies (gpt-fast clones
    its decode outputs for the same reason)."""
    return map_tensors(roots, lambda t, path: t if kept.get(id(t)) is t else t.clone(), depth)


def owns_storage(t: torch.Tensor) -> bool:
    """Whether `t` is the whole of its storage (no offset, contiguous, every byte its own)."""
    return (t.storage_offset() == 0 and t.is_contiguous()
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _home_key(path: tuple, t: torch.Tensor) -> tuple:
    return path, tuple(t.shape), t.stride(), t.dtype, t.device


class BufferHomes:
    """Per model (one per compiled decode step, step_graphs.StepGraphs): the homes of the static buffers, and how many
    generations are in flight. One home per path (a buffer of a new shape there replaces it), and homes no
    compiled step used in the last generation are let go when it ends, so the model holds one set for the
    backend and shapes it runs now, not one per backend it ever ran; a generation of those again records its
    graphs once more and takes new homes. (The KV cache itself is kept by the model: model_loaders/kv/slot_model.py.)"""

    def __init__(self):
        self.homes: dict = {}  # (path, shape, stride, dtype, device) -> tensor
        self.key_of: dict = {}  # path -> its home's key: one home per path (a new shape there replaces it)
        self.in_flight = 0
        self.used: set = set()  # keys of the homes this generation's compiled steps used
        # path -> (tensor, its home, the home's key) as last settled in this generation: a step's check is then an
        # identity and an address comparison per static path (a 7B model's cache alone is 64 of them)
        self.settled: dict = {}
        self.moved = 0  # buffers moved into their homes (all generations): the report's count

    def begin(self) -> None:
        self.in_flight += 1
        if self.in_flight == 1:
            self.used = set()

    def end(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.settled = {}  # (the generation's tensors: not kept past it)
            if self.used:  # a generation that ran compiled steps: the homes it did not use go
                self.homes = {k: h for k, h in self.homes.items() if k in self.used}
                self.key_of = {p: k for p, k in self.key_of.items() if k in self.homes}

    def settle(self, paths: dict, static) -> int:
        """Before a compiled step: each buffer at a static path of its graph (`static`, of `paths`: path -> tensor,
        the step's state) moves into its home, or becomes the home where there is none. Returns how many moved."""
        if self.in_flight != 1:
            return 0
        away = []
        for p in static:
            t = paths.get(p)
            if t is None:
                continue
            last = self.settled.get(p)
            if last is not None and last[0] is t and t.data_ptr() == last[1].data_ptr():
                continue  # in its home since an earlier step of this generation
            k = _home_key(p, t)
            home = self.homes.get(k)
            if home is None:
                if owns_storage(t):
                    # a home of another shape at this path goes now, not when the generation ends: a KV cache
                    # of another width (another backend's draft slots) is not held beside this one
                    self.homes.pop(self.key_of.get(p), None)
                    self.homes[k] = t
                    self.key_of[p] = k
                    self.used.add(k)
                    self.settled[p] = (t, t, k)
            else:
                self.used.add(k)
                if home.data_ptr() != t.data_ptr():
                    away.append((p, t, home, k))
                else:
                    self.settled[p] = (t, home, k)
        if not away:
            return 0
        users: dict = {}  # storage address -> how many reachable tensors use it
        for t in paths.values():
            users[t.untyped_storage().data_ptr()] = users.get(t.untyped_storage().data_ptr(), 0) + 1
        n = 0
        for p, t, home, k in away:
            if not owns_storage(t) or users[t.untyped_storage().data_ptr()] > 1 \
                    or users.get(home.untyped_storage().data_ptr(), 0) > 0:
                continue  # a view, a base with views, or a home some tensor of this state still uses
            home.copy_(t)
            t.set_(home)
            self.settled[p] = (t, home, k)
            n += 1
        self.moved += n
        return n


__all__ = ["BufferHomes", "copy_graph_outputs", "owns_storage", "set_static_addresses"]
