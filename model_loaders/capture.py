"""What an adapter does for a caller that captures its forward and commit in a compiled graph
(`ARImageModel.start(captured=True)`): the walk over the tensors reachable from a step's state, and
the static addresses CUDA graphs need for the buffers a step writes in place (CUDA graph trees skip a
graph that writes an input whose address is not static, and record again when a static one moves).
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

# CUDA graphs' needs (static addresses, copies of a replay's outputs, one KV cache kept per model) apply on
# CUDA only; tests switch them on for the CPU (tests/test_graph_buffers.py)
GRAPH_BUFFERS_ON_CPU = False


def uses_graph_buffers(device) -> bool:
    """Whether compiled steps on `device` need static addresses and output copies (CUDA graphs)."""
    return torch.device(device).type == "cuda" or GRAPH_BUFFERS_ON_CPU


def inference_mode_unless_traced(fn: Callable) -> Callable:
    """``fn`` under torch.inference_mode, except while dynamo traces it into a caller's compiled graph
    (itself run in inference mode): an inference-mode switch inside a graph breaks inductor on the
    graph's inference-tensor inputs."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


_ATOMS = (str, bytes, int, float, bool, torch.nn.Module, torch.device, torch.dtype, type)


def map_tensors(o, fn: Callable, depth: int, path: tuple = ()):
    """`o` with every tensor `t` reachable from it (through tuples, lists, dicts, dataclass fields and
    plain objects' attributes, `depth` levels down) replaced by ``fn(t, path)`` (`path`: the keys and
    attribute names that lead to it): lists, dicts and objects in place (frozen dataclasses too), tuples
    rebuilt. Never into a model (anything with `torch_module` or an nn.Module): the step's state, not
    the weights."""
    if isinstance(o, torch.Tensor):
        return fn(o, path)
    if depth == 0 or o is None or isinstance(o, _ATOMS) or hasattr(o, "torch_module"):
        return o
    if isinstance(o, tuple):
        new = [map_tensors(x, fn, depth - 1, path + (k,)) for k, x in enumerate(o)]
        if all(a is b for a, b in zip(new, o)):
            return o
        return type(o)(*new) if hasattr(o, "_fields") else type(o)(new)
    if isinstance(o, (list, dict)):
        for k in (range(len(o)) if isinstance(o, list) else list(o)):
            o[k] = map_tensors(o[k], fn, depth - 1, path + (k,))
        return o
    names = list(o.__dataclass_fields__) if hasattr(o, "__dataclass_fields__") else \
        list(vars(o)) if hasattr(o, "__dict__") else []
    for name in names:
        v = getattr(o, name)
        w = map_tensors(v, fn, depth - 1, path + (name,))
        if w is not v:
            object.__setattr__(o, name, w)  # frozen dataclasses too: the copy stands for the same value
    return o


def tensor_paths(*roots, depth: int = 4) -> dict:
    """The tensors reachable from `roots` by path (root index, then keys and attribute names), as
    `map_tensors` walks; a tensor reachable twice is listed under its first path."""
    found: dict = {}
    ids: set = set()

    def note(t, path):
        if id(t) not in ids:
            ids.add(id(t))
            found[path] = t
        return t

    for i, r in enumerate(roots):
        map_tensors(r, note, depth, (i,))
    return found


def reachable_tensors(*roots, depth: int = 4) -> dict:
    """The tensors reachable from `roots` (id -> tensor)."""
    return {id(t): t for t in tensor_paths(*roots, depth=depth).values()}


def is_static_address(t: torch.Tensor) -> bool:
    return getattr(t, "_dynamo_static_input_type", None) is not None


def mark_static_addresses(tensors, device) -> int:
    """Where `uses_graph_buffers`: mark `tensors` (buffers that live across steps and that a compiled step
    writes in place) as static inputs of the compiled graphs (`torch._dynamo.mark_static_address`,
    unguarded: a new generation's buffers, at new addresses, re-record a graph once, never recompile it).
    Never mark a tensor that each step replaces (a graph output): its address changes every step, and
    every step would re-record. Returns how many were marked."""
    if not uses_graph_buffers(device):
        return 0
    from torch import _dynamo
    n = 0
    for t in tensors:
        if not is_static_address(t):
            _dynamo.mark_static_address(t, guard=False)
            n += 1
    return n
