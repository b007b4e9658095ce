"""The compiled decode step of one model: the engine's `decode_step` through torch.compile (ShapeCompiled: fullgraph,
static shapes, one graph per plan), counted in its CompileStats, shared by every generation on that model (kept per
model while it lives, never written into the model).

A graph cannot draw random numbers from the generation's torch.Generator (dynamo refuses one), so the first step of
each graph key runs eager and records its draws (their kinds and shapes, which the key fixes; the values never do),
and later steps make the same draws before the graph takes them (ReplayedDraws): compiled tokens are eager tokens.
When a key compiles, and the one-off steps that never do: docs/ARCHITECTURE.md, "Compiled step".
"""
from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Callable, Optional

import torch

from ...model_loaders.capture import is_static_address, tensor_paths, uses_graph_buffers
from ..randomness import ReplayedDraws
from .graph_buffers import BufferHomes, copy_graph_outputs, set_static_addresses
from .shape_compiled import CompileStats, ShapeCompiled

_STEP_GRAPHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def step_graphs(model, step: Callable) -> "StepGraphs":
    """The model's compiled decode step, made at its first compiled generation. `step`: the eager step, ``step(run,
    plan, state, session, at_step)`` (engine.decode_step)."""
    if not model.capturable:
        raise ValueError(f"compile=True: the {type(model).__name__} adapter cannot run inside a compiled step; "
                         f"use compile=False")
    graphs = _STEP_GRAPHS.get(model)
    if graphs is None:
        graphs = _STEP_GRAPHS[model] = StepGraphs(model, step)
    return graphs


def compile_stats(model) -> Optional[CompileStats]:
    """The model's compile counters (all its compiled generations in this process); None before the first."""
    graphs = _STEP_GRAPHS.get(model)
    return None if graphs is None else graphs.stats


class StepGraphs:
    """Per model: the graphs, each key's draw tape, the paths its step writes in place (CUDA graphs' static addresses,
    seen in its eager first step), the keys compiled, and the buffer homes (graph_buffers.py)."""

    def __init__(self, model, step: Callable):
        self.step, self.stats = step, CompileStats()

        def replayed(run, plan, state, session, at_step, drawn: tuple):
            state.draws = ReplayedDraws(drawn)  # the step's draws, made before it
            return step(run, plan, state, session, at_step)

        self.step_by_shape = ShapeCompiled(replayed, model.device, "decode step", self.stats)
        self.tapes: dict = {}  # graph key -> the draws of its step: [(kind, shape, *bounds)]
        self.static_paths: dict = {}
        self.compiled_keys: set = set()
        self.homes = BufferHomes()

    def begin(self, ctx, log) -> "GraphsUse":
        return GraphsUse(self, ctx, log)

    def record(self, key, buffers: bool, *args):
        """A key's first step: eager, recording its draws (and, for CUDA graphs, the paths it writes in place)."""
        state, session, at_step = args[2:]
        live = state.draws
        if buffers:
            before = tensor_paths(state, session, at_step)
            values = {p: t.clone() for p, t in before.items() if not is_static_address(t)}
        live.tape = []
        try:
            out = self.step(*args)
        finally:
            self.tapes[key], live.tape = live.tape, None
        if buffers:  # what this plan's step writes in place: static addresses when its graph compiles
            self.static_paths[key] = {p for p, t in tensor_paths(state, session, at_step).items()
                                      if before.get(p) is t and (p not in values or not torch.equal(t, values[p]))}
        return out


class GraphsUse:
    """One generation's use of the model's StepGraphs: its steps (`step`, in place of engine.decode_step) and its
    compile report (`end`)."""

    def __init__(self, graphs: StepGraphs, ctx, log):
        """`ctx`: the generation's run_state.RunContext; `log`: its decode_step.StepLog (its drafter). Each step is
        synchronised and timed on the CPU, or with profile (CUDA: no sync per step)."""
        self.step_graphs, self.adaptive = graphs, log.adaptive
        self.timed = ctx.profile or ctx.device.type != "cuda"
        # what the graphs are specialised to besides the plan and guidance (the key they are counted under)
        self.settings = (ctx.backend, type(log.drafter), tuple(sorted(ctx.backend_params)), ctx.batch,
                         ctx.reproducible, dataclasses.astuple(ctx.sampling), ctx.same_image.pin_width)
        self.before, self.moved_before = graphs.stats.start_run(), graphs.homes.moved
        self.graph_s = 0.0  # seconds inside the graphs
        self.eager_steps = 0  # steps that ran eager (a plan's first step, or a one-off such as a probe)
        graphs.homes.begin()

    def end(self) -> dict:
        """The generation's compile block (`GenerationStats.compile`); the homes it did not use are let go."""
        g = self.step_graphs
        g.homes.end()
        return {**g.stats.run_report(self.before), "step_graph_s": self.graph_s, "eager_steps": self.eager_steps,
                "buffers_rehomed": g.homes.moved - self.moved_before}

    def step(self, run, plan, state, session, at_step):
        g, dev = self.step_graphs, state.ctx.device
        key = self.settings + (plan, session.cfg)
        tape, args = g.tapes.get(key), (run, plan, state, session, at_step)
        buffers = uses_graph_buffers(dev)  # CUDA graphs: static addresses, copies (graph_buffers.py)
        if tape is None or (key not in g.compiled_keys and self.adaptive is not None
                                 and self.adaptive.one_off(plan)):  # eager (a probe: live draws)
            self.eager_steps += 1
            return g.record(key, buffers, *args) if tape is None else g.step(*args)
        live = state.draws
        drawn = live.replay(tape)
        compiling = key not in g.compiled_keys  # this call compiles the plan's graph
        g.compiled_keys.add(key)
        if buffers:
            paths = tensor_paths(state, session, at_step)
            static = g.static_paths.get(key, set())
            g.homes.settle(paths, static)  # this generation's buffers into the addresses the graph recorded
            kept = {id(t): t for t in paths.values()}  # what exists before the step: not its outputs
            if compiling:  # its static inputs now
                set_static_addresses(paths, static, dev)
        t = time.perf_counter()
        try:
            out = g.step_by_shape(key, *args, drawn)
        finally:
            state.draws = live
        if buffers:  # what the step made lives in its CUDA graph's pool until the next replay: copies
            out = copy_graph_outputs((out, state, session), kept)[0]
        if self.timed:
            run.sync()
            self.graph_s += time.perf_counter() - t
        return out
