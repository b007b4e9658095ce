"""torch.compile of a fixed-shape tensor function: one compiled graph per shape key, counted.

`ShapeCompiled` wraps one function (the engine's decode step, or a model's forward on its own for the measuring
commands): ``fullgraph=True`` (a graph break is an error, which proves the function has no host read such as
``.item()`` and no data-dependent shape), ``dynamic=False`` (each shape gets its own static graph, as CUDA graphs
need); the modes per device and the scoped settings: docs/ARCHITECTURE.md, "Compiled step".

It counts graphs compiled, graph breaks, and recompiles (a new graph for a key already compiled: a guard that failed,
the thing that must never happen between steps). When compiling is not possible here (no C++ compiler, an
unsupported op), it says so once and runs eager: the tokens do not depend on it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch

from . import compile_stage
from .few_rows_matmul import MAX_ROWS, few_rows_pass

_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
# dynamo's cache entries per function for our compiles: every plan is one entry of the decode step
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
        """The totals since these counters were made (per model: every generation of this process)."""
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
# longer compiles). Measured on the demo model, 2026-11-27.
# emulate_precision_casts, every bf16 / fp16 rounding of eager kept in fused kernels: a half-precision graph
# then computes eager's values (the batch-invariant forwards need them: model_loaders/precision/batch_invariant.py).
CPU_INDUCTOR_OPTIONS = {"cpp_wrapper": True, "emulate_precision_casts": True}


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
    for the shape), eager after a failure to compile. Each object compiles its own copy of `fn`'s
    code: dynamo keeps its graphs (and checks their guards) per code object, so the graphs of two
    objects (two models) stay apart and each counts its own recompile limit."""

    def __init__(self, fn: Callable, device: torch.device, name: str, stats: CompileStats,
                 few_rows: int = MAX_ROWS):
        self.eager, self.name, self.stats = fn, name, stats  # eager: what runs after a failure to compile
        self.seen: set = set()
        self.cache_dir = persistent_cache_dir()
        own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        self.fn = torch.compile(own, fullgraph=True, dynamic=False, **compile_settings(device, few_rows))

    def __call__(self, key: Hashable, *args):
        st = self.stats
        if st.eager_fallback:
            return self.eager(*args)
        graphs, breaks = _dynamo_counts()
        t0 = time.perf_counter()
        try:
            if key in self.seen:  # compiled before: no compile, no settings to scope (a step's overhead)
                out = self.fn(*args)
            else:
                compile_stage.starting(self.name)
                with compile_scope(self.cache_dir):
                    out = self.fn(*args)
        except Exception as e:  # noqa: BLE001 -- any compiler failure: say why once, then eager
            if key in self.seen:
                raise  # a step that compiled and ran before: a real error, not the compiler's
            st.eager_fallback = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            print(f"specar: torch.compile of the {self.name} failed, running eager "
                  f"(same tokens, no speed-up): {st.eager_fallback}", file=sys.stderr)
            return self.eager(*args)
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
