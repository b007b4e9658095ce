"""Homes of a compiled step's static buffers: the same addresses in every generation (CUDA graphs).

CUDA graph trees record a graph with the addresses of its static inputs (the buffers a step writes in
place: the KV cache, the loop's sequence, a drafter's scratch; compiled.py) and re-record it whenever one
of them moves. Every generation allocates its buffers anew, so without homes each graph records once more
per generation, every step of the next generation first checks the old recording's addresses and fails
(the first GPU runs, docs/BENCHMARKS.md "GPU check": "static input data pointer changed", x255 for AR), and
the recordings pile up in a long session (ComfyUI runs many generations on one loaded model).

The buffers of the generation that compiled a graph become the homes of their paths in the step's state
(`tensor_paths`: root, then field names and keys). A later generation's buffer at a home's path, with the
home's shape, strides and dtype, moves into the home at its first compiled step: its values are copied in
and the tensor object is re-pointed at the home's storage (`Tensor.set_`), so every reference to it (the
state's fields, the engine's locals) sees the home, and its own allocation is freed. Nothing moves when
that would change what a read sees: a buffer that shares its storage with another reachable tensor (a
view, or a base with views) stays where it is (its graph records once more, as without homes), and
nothing moves while another generation on the model is in flight (both would write one home).

The caller keeps what it hands out of a generation apart from the homes (the engine returns a copy of the
tokens): the next generation overwrites the homes.
"""
from __future__ import annotations

import torch


def owns_storage(t: torch.Tensor) -> bool:
    """Whether `t` is the whole of its storage (no offset, contiguous, every byte its own)."""
    return (t.storage_offset() == 0 and t.is_contiguous()
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _home_key(path: tuple, t: torch.Tensor) -> tuple:
    return path, tuple(t.shape), t.stride(), t.dtype, t.device


class BufferHomes:
    """Per model (one per compiled decode step, engine.StepGraphs): path -> the tensor whose storage is
    that path's home, and how many generations are in flight."""

    def __init__(self):
        self.homes: dict = {}  # (path, shape, stride, dtype, device) -> tensor
        self.paths: set = set()  # the paths that have a home (a cheap first test per step)
        self.in_flight = 0
        self.moved = 0  # buffers moved into their homes (all generations): the report's count

    def begin(self) -> None:
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1

    def adopt(self, paths: dict, static: set) -> None:
        """At a graph's compile: the buffers at its static paths become their paths' homes (where none is yet)."""
        for p in static:
            t = paths.get(p)
            if t is not None and owns_storage(t):
                self.homes.setdefault(_home_key(p, t), t)
                self.paths.add(p)

    def move_in(self, paths: dict) -> int:
        """Move the buffers of `paths` (path -> tensor: the step's state) into their homes; returns how many moved."""
        if self.in_flight != 1 or not self.homes:
            return 0
        # a step's host work: a set lookup per path; the rest only for a buffer not in its home yet
        away = []
        for p, t in paths.items():
            if p in self.paths:
                home = self.homes.get(_home_key(p, t))
                if home is not None and home.data_ptr() != t.data_ptr():
                    away.append((t, home))
        if not away:
            return 0
        users: dict = {}  # storage address -> how many reachable tensors use it
        for t in paths.values():
            users[t.untyped_storage().data_ptr()] = users.get(t.untyped_storage().data_ptr(), 0) + 1
        n = 0
        for t, home in away:
            if not owns_storage(t) or users[t.untyped_storage().data_ptr()] > 1 \
                    or users.get(home.untyped_storage().data_ptr(), 0) > 0:
                continue  # a view, a base with views, or a home some tensor of this state still uses
            home.copy_(t)
            t.set_(home)
            n += 1
        self.moved += n
        return n


__all__ = ["BufferHomes", "owns_storage"]
