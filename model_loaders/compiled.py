"""torch.compile of the fixed-shape step: one compiled graph per shape, counted.

A generation sends the model one or two forward shapes (the Jacobi chain, and the chain plus
SJD-PAC's proactive branches) or one padded tree shape (Hawk, ADT-Tree), so every shape is
compiled once and reused for every step and every later generation with the same shapes.
`ShapeCompiled` wraps one pure tensor function: ``fullgraph=True`` (a graph break is an error,
which proves the step has no host read such as ``.item()`` and no data-dependent shape),
``dynamic=False`` (each shape gets its own static graph, as CUDA graphs need), mode
``reduce-overhead`` on CUDA (CUDA graphs), inductor's C++ wrapper on the CPU
(`compile_settings`).

It counts what dynamo did while it ran: graphs compiled, graph breaks, and recompiles (a new
graph for a shape that was already compiled: a guard that failed, the thing that must never
happen between steps). When compiling is not possible here (no C++ compiler, an unsupported
op), it says so once and runs eager: the tokens do not depend on it.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

from . import compile_stage
from .few_rows_matmul import MAX_ROWS, few_rows_pass

_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
# dynamo's cache entries per function for our compiles: every shape is one entry of `_step_logits`
# (a generation uses 1-7, a process that changes settings a few more); dynamo's default limit (8)
# would silently fall back to eager
RECOMPILE_LIMIT = 64


def persistent_cache_dir() -> str:
    """Inductor's on-disk cache (compiled kernels, FX graphs): kept across processes so a second
    process does not compile again. ``$TORCHINDUCTOR_CACHE_DIR`` if the user set it, else a folder
    in the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    if os.environ.get(_CACHE_ENV):
        return os.environ[_CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "specar", "torchinductor")


@contextlib.contextmanager
def compile_scope(cache_dir: str, recompile_limit: int = RECOMPILE_LIMIT):
    """What our compiles need, around the calls that may compile and restored after, never set for
    the process (SpecAR runs inside ComfyUI's): dynamo's recompile limit (a `config.patch`) and
    inductor's cache folder. Inductor reads its folder only from ``$TORCHINDUCTOR_CACHE_DIR`` (no
    config option or compile argument in torch 2.13), so that variable is set for the call and
    restored after (torch's own `temporary_cache_dir` where it exists): a scoped change of the
    environment, the one left (docs/ARCHITECTURE.md)."""
    from torch._dynamo import config as dynamo_config
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # older torch
    with dynamo_config.patch(**{name: max(getattr(dynamo_config, name), recompile_limit)}), \
            _inductor_cache_dir(cache_dir):
        yield


@contextlib.contextmanager
def _inductor_cache_dir(path: str):
    if os.environ.get(_CACHE_ENV) == path:  # the user's own setting
        yield
        return
    try:
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    except ImportError:  # an older torch: set and restore the variable ourselves
        old = os.environ.get(_CACHE_ENV)
        os.environ[_CACHE_ENV] = path
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(_CACHE_ENV, None)
            else:
                os.environ[_CACHE_ENV] = old
        return
    with temporary_cache_dir(path):
        yield


def inference_mode_unless_compiling(fn: Callable) -> Callable:
    """``fn`` under torch.inference_mode, except while dynamo traces it into a caller's compiled graph
    (the engine's compiled decode step, itself run in inference mode): an inference-mode switch
    inside a graph breaks inductor on the graph's inference-tensor inputs."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


@dataclass
class CompileStats:
    compiles: int = 0  # graphs compiled (one per new shape)
    recompiles: int = 0  # graphs compiled for a shape already compiled (must stay 0)
    graph_breaks: int = 0  # must stay 0 (fullgraph=True turns one into an error, then eager)
    compile_s: float = 0.0  # wall time of the calls that compiled
    eager_fallback: str = ""  # why compiling was given up ("" while it works)
    shapes: set = field(default_factory=set)  # the shape keys compiled so far (one graph each)
    used: set = field(default_factory=set)  # the shape keys run since `start_run`

    COUNTERS = ("compiles", "recompiles", "graph_breaks", "compile_s")

    def to_dict(self) -> dict:
        """The model's totals since its compiled step was made (every generation of this process)."""
        out = {k: getattr(self, k) for k in self.COUNTERS}
        return {**out, "graphs": len(self.shapes), "eager_fallback": self.eager_fallback}

    def start_run(self) -> dict:
        """Mark the start of one generation; returns what `run_report` subtracts."""
        self.used = set()
        return {**{k: getattr(self, k) for k in self.COUNTERS}, "shapes": frozenset(self.shapes)}

    def run_report(self, before: dict) -> dict:
        """One generation's compile block: the graphs it compiled and their seconds (not the process's
        totals), how many of the graphs it ran were compiled by an earlier generation (reused), and the
        model's totals under `model_total`."""
        out = {k: getattr(self, k) - before[k] for k in self.COUNTERS}
        out["graphs_used"] = len(self.used)
        out["graphs_reused"] = len(self.used & before["shapes"])
        out["eager_fallback"] = self.eager_fallback
        out["model_total"] = self.to_dict()
        return out


def _dynamo_counts() -> tuple:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


# Inductor's settings for a CPU step, given to this compile only (never set for the user's process):
# cpp_wrapper, the graph's driver in generated C++ instead of Python: a decode step of a small model
# runs a hundred tiny kernels (one token x two CFG rows), and the Python wrapper's per-kernel work
# (argument handling, buffer allocation, size asserts) is then a visible share of the step.
# post_grad_custom_pre_pass, products of a few rows as a multiply-and-sum instead of BLAS's GEMM
# (few_rows_matmul.py: GEMM's set-up dominated the decode step). Absent on a torch without the API.
# Not used: freezing (weights as graph constants; no clear gain measured, and a graph that silently
# keeps old weights if an adapter ever changed them) and max-autotune (no gain at these shapes,
# longer compiles). Measured on the demo model: docs/BENCHMARKS.md "The compiled step".
CPU_INDUCTOR_OPTIONS = {"cpp_wrapper": True}


# CUDA graphs' needs (static addresses, copies of a replay's outputs) apply on CUDA only; a test switches
# them on for the CPU to check without a GPU that no compiled step writes a buffer left unmarked, the one
# thing that makes CUDA graph trees skip a graph (tests/test_graph_buffers.py)
GRAPH_BUFFERS_ON_CPU = False


def uses_graph_buffers(device) -> bool:
    """Whether compiled steps on `device` need static addresses and output copies (CUDA graphs)."""
    return torch.device(device).type == "cuda" or GRAPH_BUFFERS_ON_CPU


_ATOMS = (str, bytes, int, float, bool, torch.nn.Module, torch.device, torch.dtype, type)


def _map_tensors(o, fn: Callable, depth: int, path: tuple = ()):
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
        new = [_map_tensors(x, fn, depth - 1, path + (k,)) for k, x in enumerate(o)]
        if all(a is b for a, b in zip(new, o)):
            return o
        return type(o)(*new) if hasattr(o, "_fields") else type(o)(new)
    if isinstance(o, (list, dict)):
        for k in (range(len(o)) if isinstance(o, list) else list(o)):
            o[k] = _map_tensors(o[k], fn, depth - 1, path + (k,))
        return o
    names = list(o.__dataclass_fields__) if hasattr(o, "__dataclass_fields__") else \
        list(vars(o)) if hasattr(o, "__dict__") else []
    for name in names:
        v = getattr(o, name)
        w = _map_tensors(v, fn, depth - 1, path + (name,))
        if w is not v:
            object.__setattr__(o, name, w)  # frozen dataclasses too: the copy stands for the same value
    return o


def tensor_paths(*roots, depth: int = 4) -> dict:
    """The tensors reachable from `roots` by path (root index, then keys and attribute names), as
    `_map_tensors` walks; a tensor reachable twice is listed under its first path."""
    found: dict = {}
    ids: set = set()

    def note(t, path):
        if id(t) not in ids:
            ids.add(id(t))
            found[path] = t
        return t

    for i, r in enumerate(roots):
        _map_tensors(r, note, depth, (i,))
    return found


def reachable_tensors(*roots, depth: int = 4) -> dict:
    """The tensors reachable from `roots` (id -> tensor)."""
    return {id(t): t for t in tensor_paths(*roots, depth=depth).values()}


def copy_graph_outputs(roots, kept: dict, depth: int = 4):
    """`roots` with every reachable tensor that is not in `kept` (id -> tensor: what existed before
    the compiled step ran) replaced by a copy. On CUDA a graph's outputs live in its CUDA graph's
    memory pool and the next replay overwrites them (CUDA graph trees then refuse to read them: "accessing
    tensor output of CUDAGraphs that has been overwritten"); the loop keeps some across steps (the
    frontier, the drafter's state, the report's per-step counts), so it keeps copies (gpt-fast clones
    its decode outputs for the same reason)."""
    return _map_tensors(roots, lambda t, path: t if kept.get(id(t)) is t else t.clone(), depth)


def is_static_address(t: torch.Tensor) -> bool:
    return getattr(t, "_dynamo_static_input_type", None) is not None


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


def mark_static_addresses(tensors, device) -> int:
    """On CUDA: mark `tensors` (buffers that live across steps and that a compiled step writes in
    place: the KV cache, the sequence, a drafter's scratch) as static inputs of the compiled graphs
    (`torch._dynamo.mark_static_address`, unguarded). CUDA graph trees refuse a graph that mutates a
    non-static input ("skipping cudagraphs due to mutated inputs": the first GPU run, docs/BENCHMARKS.md
    "GPU check"), so without the mark every compiled step ran without CUDA graphs. Unguarded: a new
    generation's buffers (new addresses) re-record the graph once, never recompile it. Never mark a
    tensor that each step replaces (a graph output): its address changes every step, and every step
    would re-record. No-op off CUDA. Returns how many were marked."""
    if not uses_graph_buffers(device):
        return 0
    from torch import _dynamo
    n = 0
    for t in tensors:
        if not is_static_address(t):
            _dynamo.mark_static_address(t, guard=False)
            n += 1
    return n


def compile_settings(device, few_rows: int = MAX_ROWS) -> dict:
    """torch.compile's mode or options for a step on `device`: CUDA graphs on CUDA (mode
    ``reduce-overhead``); on the CPU inductor's C++ wrapper, and products of at most `few_rows`
    rows as a multiply-and-sum (few_rows_matmul.py; 0: none)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return {"mode": "reduce-overhead"}
    if kind == "cpu":
        options = dict(CPU_INDUCTOR_OPTIONS)
        rewrite = few_rows_pass(few_rows)
        if rewrite is not None:
            options["post_grad_custom_pre_pass"] = rewrite
        return {"options": options}
    return {}


class ShapeCompiled:
    """``f(key, *args)``: ``fn(*args)`` through one compiled graph per ``key`` (the caller's name
    for the shape), eager after a failure to compile."""

    def __init__(self, fn: Callable, device: torch.device, name: str, stats: CompileStats,
                 few_rows: int = MAX_ROWS):
        self.fn, self.name, self.stats, self.few_rows = fn, name, stats, few_rows
        self.seen: set = set()
        self.cache_dir = persistent_cache_dir()
        self.compiled = torch.compile(fn, fullgraph=True, dynamic=False,
                                      **compile_settings(device, few_rows))

    def __call__(self, key: Hashable, *args):
        st = self.stats
        if st.eager_fallback:
            return self.fn(*args)
        graphs, breaks = _dynamo_counts()
        t0 = time.perf_counter()
        try:
            if key in self.seen:  # compiled before: no compile, no settings to scope (a step's overhead)
                out = self.compiled(*args)
            else:
                compile_stage.starting(self.name)
                with compile_scope(self.cache_dir):
                    out = self.compiled(*args)
        except Exception as e:  # noqa: BLE001 -- any compiler failure: say why once, then eager
            if key in self.seen:
                raise  # a step that compiled and ran before: a real error, not the compiler's
            st.eager_fallback = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            print(f"specar: torch.compile of the {self.name} failed, running eager "
                  f"(same tokens, no speed-up): {st.eager_fallback}", file=sys.stderr)
            return self.fn(*args)
        graphs_after, breaks_after = _dynamo_counts()
        new = graphs_after - graphs
        if new:
            st.compiles += new
            st.compile_s += time.perf_counter() - t0
            if key in self.seen:
                st.recompiles += new
        st.graph_breaks += breaks_after - breaks
        self.seen.add(key)
        st.shapes.add(key)
        st.used.add(key)
        return out

