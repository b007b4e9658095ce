"""The speculative engine: one loop for every backend, in named phases.

    propose (drafter) -> forward (model) -> verify (drafter, with samplers/verify.py)
    -> commit (engine) -> observe (drafter)

Per image row b the engine keeps ``frontier[b]``: the position of the *pending* token, the last
committed token whose KV is not cached yet. The drafter proposes a tree whose node 0 is the
pending token; the forward's output at node i is the target p of the position after it.
Verification accepts a path of drafts; the token after it (a residual sample, or a fresh sample
of p when the whole path passed) becomes the new pending token. So every step commits at least
one token, and AR is the same loop with no drafts.

Forced structure tokens (row ends) are never sampled: the engine writes them, and drafters put
them in their trees as always-accepted nodes, so they never cost a forward of their own.

Everything is batched over image rows with fixed shapes; a step reads one small tensor back to
the host (rows still running, tokens done, the drafter's hint, a bad-logits flag), nothing per token.
From that read the drafter `plan`s the step (its shapes) on the host; everything after is device
work (`decode_step`), which `compile=True` runs as one compiled graph per plan.
"""
from __future__ import annotations

import dataclasses
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..model_loaders.contract import ARImageModel, EncodedPrompt, Session
from .backends import BackendConfig
from .drafters.base import Drafter, DraftTree, LoopState, SequenceLayout, Verdict
from ..model_loaders import batch_invariant
from ..model_loaders.buffer_homes import BufferHomes
from ..model_loaders.compiled import (ShapeCompiled, copy_graph_outputs, is_static_address, set_static_addresses,
                                      tensor_paths, uses_graph_buffers)
from .randomness import Draws, ReplayedDraws, make_generator
from .stats import GenerationStats
from .target import SamplingParams, invalid_rows, target_probs


# the engine's calibration of forward costs (`_calibrate`), per model: kept while the model lives, never
# written into the model (it is the engine's state, not the adapter's)
_FORWARD_COSTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# the compiled decode step (`decode_step` through torch.compile, one graph per plan), per model: its graphs
# serve every later generation on that model (engine state, like the costs)
_STEP_GRAPHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class GenerationInterrupted(Exception):
    """Raised when the caller's interrupt check fires; the model stays usable."""


@dataclass
class StepLog:
    """What the engine records per step for the statistics."""

    committed: list = field(default_factory=list)  # [B] tokens settled per step
    active: list = field(default_factory=list)  # [B] rows that took part
    graph_s: float = 0.0  # seconds inside the compiled decode step's graphs (compile=True)
    eager_steps: int = 0  # compile=True: steps that ran eager (a plan's first step, or a one-off such as a probe)


def decode_step(engine: "SpeculativeEngine", plan, state: LoopState, session: Session, at_step: torch.Tensor):
    """One decode step after its plan, every phase on the device: propose -> forward -> target ->
    verify -> commit -> observe. No host read, no shape that depends on a value: with compile=True
    it runs as one graph per plan. It writes the loop's tensors (`state`: seq, frontier, the
    drafter's state), the session's cache and `at_step`; returns (bad-logits flag, [B] tokens each
    row settled, [B] rows that took part)."""
    drafter, active = engine.drafter, state.active
    tree = drafter.propose(state, plan)
    out, p = engine._forward(session, tree)
    verdict = drafter.verify(state, plan, tree, p, out)
    previous = state.frontier
    bad, committed = engine._commit(session, state, verdict, at_step)
    state.draft = drafter.observe(state, plan, tree, verdict, p, out, previous)
    state.active = state.frontier < engine.layout.last_img
    return bad, committed, active


class StepGraphs:
    """The compiled decode step of one model: `decode_step` through torch.compile (compiled.ShapeCompiled:
    fullgraph, static shapes, one graph per plan, counted in the model's CompileStats), shared by every
    generation on that model.

    A graph cannot draw random numbers from the generation's torch.Generator (dynamo refuses one). So
    the first step of each graph key (plan and settings) runs eager and records its draws: their kinds
    and shapes, which the key fixes (the backend's parameters, the plan, batch, guidance, mode and
    sampling settings decide every draw's presence and shape; the values never do). Every later step
    with that key, in this generation or a later one, makes the same draws from the generator before
    its graph runs, and the graph takes them in the order it asks (ReplayedDraws): the numbers the
    eager step would have drawn, so compiled tokens are eager tokens.

    A key's graph compiles at its second step, in this generation or a later one, unless the drafter calls
    the step a one-off (`Drafter.one_off`: auto's probe of a window it does not run), which runs eager
    instead of compiling a graph, seconds on a CPU, inside whichever generation first probed it twice."""

    def __init__(self, model: ARImageModel, stats):
        self.stats = stats
        # dynamo keeps its graphs (and checks their guards) per code object: a copy of the step's function per
        # model keeps each model's graphs apart (no guard checks against other models' graphs, the recompile
        # limit counted per model)
        code = _replayed_decode_step.__code__.replace()  # an equal, distinct code object
        step = types.FunctionType(code, _replayed_decode_step.__globals__, _replayed_decode_step.__name__)
        self.graphs = ShapeCompiled(step, model.device, "decode step", stats)
        self.tapes: dict = {}  # graph key -> the draws of its step: [(kind, shape, *bounds)]
        # per graph key, the paths of the tensors its step writes in place (seen in its eager first step: CUDA
        # graphs' static addresses, compiled.py), and the keys whose graph was compiled
        self.static_paths: dict = {}
        self.compiled: set = set()
        # CUDA graphs: the static buffers' homes, the same addresses in every generation (buffer_homes.py)
        self.homes = BufferHomes()

    def run(self, engine: "SpeculativeEngine", plan, state: LoopState, session: Session, at_step, log: StepLog):
        key = engine._graph_key(plan, session)
        tape = self.tapes.get(key)
        live = state.draws
        buffers = uses_graph_buffers(engine.model.device)  # CUDA graphs: static addresses, copies (compiled.py)
        if tape is not None and key not in self.compiled and engine.drafter.one_off(plan):  # a probe: eager
            log.eager_steps += 1
            return decode_step(engine, plan, state, session, at_step)  # (its draws are the tape's, live)
        if tape is None:  # this key's first step: eager, recording its draws
            log.eager_steps += 1
            if buffers:
                before = tensor_paths(state, session, at_step)
                values = {p: t.clone() for p, t in before.items() if not is_static_address(t)}
            live.tape = []
            try:
                out = decode_step(engine, plan, state, session, at_step)
            finally:
                tape, live.tape = live.tape, None
            self.tapes[key] = tape
            if buffers:  # what this plan's step writes in place: static addresses when its graph compiles
                self.static_paths[key] = {p for p, t in tensor_paths(state, session, at_step).items()
                                          if before.get(p) is t and (p not in values or not torch.equal(t, values[p]))}
            return out
        drawn = live.replay(tape)
        timed = engine.profile or engine.model.device.type != "cuda"  # CUDA: no sync per step unless profiling
        compiling = key not in self.compiled  # this call compiles the plan's graph
        self.compiled.add(key)
        if buffers:
            paths = tensor_paths(state, session, at_step)
            static = self.static_paths.get(key, set())
            self.homes.settle(paths, static)  # this generation's buffers into the addresses the graph recorded
            kept = {id(t): t for t in paths.values()}  # what exists before the step: not its outputs
            if compiling:  # its static inputs now
                set_static_addresses(paths, static, engine.model.device)
        t = time.perf_counter()
        try:
            out = self.graphs(key, engine, plan, state, session, at_step, drawn)
        finally:
            state.draws = live
        if buffers:  # what the step made lives in its CUDA graph's pool until the next replay: copies
            out = copy_graph_outputs((out, state, session), kept)[0]
        if timed:
            engine._sync()
            log.graph_s += time.perf_counter() - t
        return out


def _replayed_decode_step(engine, plan, state, session, at_step, drawn: tuple):
    """`decode_step` with its random draws made before it (what the compiled step captures)."""
    state.draws = ReplayedDraws(drawn)
    return decode_step(engine, plan, state, session, at_step)


class SpeculativeEngine:
    def __init__(self, model: ARImageModel, backend: BackendConfig, sampling: SamplingParams, seed: int, batch: int,
                 profile: bool = False, compile: bool = False, reproducible: Optional[bool] = None):
        self.model, self.backend, self.sampling, self.seed, self.batch = model, backend, sampling, seed, batch
        self.profile, self.compile = profile, compile
        self.compile_stats = self.step_graphs = None
        if compile:  # the whole decode step through torch.compile, one static graph per plan (compiled.py)
            if not model.supports_compile:
                raise ValueError(f"compile=True: the {type(model).__name__} adapter has no compiled step; "
                                 f"use compile=False")
            self.compile_stats = model.compile_step()  # the model's counters: its forwards' graphs and the steps'
            self.step_graphs = _STEP_GRAPHS.get(model)
            if self.step_graphs is None or self.step_graphs.stats is not self.compile_stats:
                self.step_graphs = _STEP_GRAPHS[model] = StepGraphs(model, self.compile_stats)
        self.drafter: Drafter = backend.make_drafter(model, sampling)
        self.drafter.compiled_step = compile
        if reproducible and not self.drafter.lossless:
            raise ValueError(f"reproducible=True (same_image_as_ar) needs a lossless backend: this {backend.name} "
                             f"configuration is lossy (relaxed acceptance keeps drafts AR would not sample); turn "
                             f"relaxed off, or same_image_as_ar (reproducible) off")
        # "same image as AR": verification by agreement (docs/REPRODUCIBLE.md); None: on for a lossless backend
        self.reproducible = self.drafter.lossless if reproducible is None else reproducible
        # the target's forwards: batch-invariant where the same image needs it (model_loaders/batch_invariant.py)
        self.target_mode, self.same_image_guarantee = batch_invariant.plan(model, self.reproducible)
        self.layout = SequenceLayout.build(model.geometry, self.drafter.slack, model.device)
        # what the compiled step is specialised to besides the plan and guidance (`_graph_key`), fixed per engine
        self._key_settings = (backend.name, type(self.drafter), tuple(sorted(backend.params().items())), batch,
                              self.reproducible, dataclasses.astuple(sampling))

    # -- the loop ------------------------------------------------------------------------------
    @torch.inference_mode()  # the whole generation: tensors made in one step are the next step's graph inputs
    def run(self, prompt: EncodedPrompt, progress: Optional[Callable] = None,
            interrupt: Optional[Callable[[], bool]] = None, preview=None):
        dev = self.model.device
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        # eager: the forward timed apart from the rest of the step (CPU, or profile); compiled: the graphs
        self.timed = (self.profile or dev.type != "cuda") and not self.compile
        self._sync, self.forward_s = sync, 0.0
        if dev.type == "cuda":  # peak memory of this generation, not of the process so far
            torch.cuda.reset_peak_memory_stats(dev)
        compile_before = None if self.compile_stats is None else self.compile_stats.start_run()
        t0 = time.perf_counter()
        session, state, bad = self._prefill(prompt)
        self._calibrate(session, sync)
        sync()
        t1 = time.perf_counter()
        at_step = torch.zeros_like(state.seq)
        log = StepLog()
        homes = None if self.step_graphs is None else self.step_graphs.homes
        moved_before = 0 if homes is None else homes.moved
        if homes is not None:
            homes.begin()
        try:
            self._loop(state, session, at_step, bad, log, progress, interrupt, preview)
        finally:
            if homes is not None:
                homes.end()
        sync()
        t2 = time.perf_counter()
        forward_s = self.forward_s if self.timed else None
        stats = self._stats(log, at_step, state.step, t1 - t0, t2 - t1, forward_s)
        if compile_before is not None:  # this generation's compiles, not the process's (model_total has those)
            stats.compile = self.compile_stats.run_report(compile_before)
            stats.compile["step_graph_s"] = log.graph_s  # decode time inside the compiled step's graphs
            stats.compile["eager_steps"] = log.eager_steps  # steps of plans not compiled yet
            stats.compile["buffers_rehomed"] = homes.moved - moved_before  # CUDA graphs: buffers moved to their homes
        return self._tokens_out(state), stats

    def _tokens_out(self, state: LoopState) -> torch.Tensor:
        """The generation's tokens, a copy: the sequence may live in a buffer home (CUDA graphs, buffer_homes.py)
        that the next generation on the model overwrites."""
        return state.seq[:, : self.model.geometry.seq_len].clone()

    def _loop(self, state, session, at_step, bad, log: StepLog, progress, interrupt, preview) -> None:
        """The decode steps: host read, plan, the step (compiled or eager), until every row is done."""
        while self._host_read(state, bad, progress, interrupt):
            if preview is not None and preview.due():  # a host clock read; the copy only when due
                N = self.model.geometry.seq_len
                preview(state.seq[:, :N], torch.where(state.active, state.frontier + 1, N), at_step)
            plan = self.drafter.plan(state, self._hint)
            if self.step_graphs is None:
                step_bad, committed, active = decode_step(self, plan, state, session, at_step)
            else:
                step_bad, committed, active = self.step_graphs.run(self, plan, state, session, at_step, log)
            state.step += 1
            bad = bad | step_bad
            log.committed.append(committed)
            log.active.append(active)

    # -- phases --------------------------------------------------------------------------------
    def _prefill(self, prompt):
        """Prefill, the first token (a sample of position 0's target), and the drafter's start."""
        model, B, V, dev = self.model, self.batch, self.model.geometry.vocab_size, self.model.device
        self._check_positions(prompt)
        # compiled: the session laid out for static graphs, its forward captured inside the compiled decode step
        with self.target_mode():
            session = model.start(prompt, B, self.sampling.uses_cfg, draft_capacity=self.drafter.node_budget + 1,
                                  compile="caller" if self.compile else False)
        first = session.first
        p0 = target_probs(first.cond[:, 0], None if first.uncond is None else first.uncond[:, 0], self.sampling)
        layout = self.layout
        known = torch.where(layout.forced >= 0, layout.forced, 0)  # forced tokens in place, 0 elsewhere
        state = LoopState(
            model=model, sampling=self.sampling, layout=layout, batch=B, vocab_size=V, device=dev,
            draws=Draws(make_generator(self.seed, dev), dev), seed=self.seed, rows=torch.arange(B, device=dev),
            frontier=torch.zeros(B, dtype=torch.long, device=dev), active=torch.ones(B, dtype=torch.bool, device=dev),
            # one spare column past the end: masked-out writes land there (a single index_put)
            seq=torch.cat([known, known.new_zeros(1)]).expand(B, layout.ext + 1).clone(),
            reproducible=self.reproducible, step_count=torch.zeros((), dtype=torch.long, device=dev))
        x0 = state.sample_at(p0, state.frontier)
        state.write_tokens(state.frontier[:, None], state.active[:, None], x0[:, None])
        state.draft = self.drafter.start(state, first, p0)
        state.active = state.frontier < layout.last_img
        return session, state, invalid_rows(p0).any()

    def _calibrate(self, session, sync) -> None:
        """Seconds per forward at each shape an adaptive drafter may choose (`cost_shapes`), timed
        on this session once per model, batch, guidance, compile setting, thread count and target mode
        (kept by the engine per model, `_FORWARD_COSTS`). The forwards write only cache slots past the
        committed prefix, which every later forward overwrites before reading: the generation is
        unchanged."""
        shapes = self.drafter.cost_shapes()
        if not shapes:
            return
        cache = _FORWARD_COSTS.setdefault(self.model, {})
        key = (self.batch, session.cfg, self.compile, torch.get_num_threads(), self.target_mode,
               tuple(len(parents) for parents in shapes.values()))
        if key not in cache:
            cache[key] = self._time_forwards(session, shapes, sync)
        self.drafter.set_costs(cache[key])

    def _time_forwards(self, session, shapes: dict, sync, rounds: int = 5) -> dict:
        """Seconds per forward of each shape: the fastest of `rounds` timings taken round-robin
        over the shapes (a load spike from another process then hits one timing of every shape,
        and the minimum drops it), smoothed by the least-squares line cost = a + b * tokens
        (b >= 0): a forward's cost grows with its tokens, and one bad timing must not make a
        bigger shape look cheaper than a smaller one (or the reverse)."""
        B, dev = self.batch, self.model.device
        best = {w: float("inf") for w in shapes}
        for r in range(rounds + 1):  # round 0 warms up (and compiles, when compiled)
            for w, parents in shapes.items():
                tokens = torch.zeros(B, len(parents), dtype=torch.long, device=dev)
                sync()
                t = time.perf_counter()
                with self.target_mode():
                    self.model.forward(session, tokens, parents)
                sync()
                if r:
                    best[w] = min(best[w], time.perf_counter() - t)
        n = [len(parents) for parents in shapes.values()]
        y = list(best.values())
        mean_n, mean_y = sum(n) / len(n), sum(y) / len(y)
        var = sum((x - mean_n) ** 2 for x in n)
        slope = max(sum((x - mean_n) * (v - mean_y) for x, v in zip(n, y)) / var, 0.0) if var else 0.0
        base = max(mean_y - slope * mean_n, min(y) * 0.5)
        return {w: base + slope * len(parents) for w, parents in shapes.items()}

    def _check_positions(self, prompt) -> None:
        """A tree that does not fit in the model's positions fails before the prefill, naming the
        backend parameters that set its size and the largest node budget this model allows."""
        limit = self.model.max_positions
        if limit is None:
            return
        P = max(len(prompt.cond), len(prompt.uncond) if self.sampling.uses_cfg else 0)
        budget = self.drafter.node_budget
        need = self.model.positions_needed(P, budget + 1)
        if need > limit:
            allowed = limit - self.model.positions_needed(P, 1)
            names = self.backend.schema.size_params
            sizes = [f"{n}={getattr(self.backend.typed_params, n)}" for n in names]
            raise ValueError(f"{self.backend.name} with {', '.join(sizes)} needs {budget} draft slots per "
                             f"forward, but this model ({limit} positions, a {P}-token prompt and a "
                             f"{self.model.geometry.seq_len}-token image) allows at most {max(allowed, 0)}: lower "
                             f"{' or '.join(names) or 'the tree size'}")

    def _graph_key(self, plan, session: Session) -> tuple:
        """What the compiled decode step is specialised to (the key its graphs are counted under)."""
        return self._key_settings + (plan, session.cfg)

    def _host_read(self, state, bad, progress, interrupt) -> bool:
        """The step's one read of device values: False when every row is done."""
        N = self.model.geometry.seq_len
        done = torch.where(state.active, state.frontier + 1, N)  # committed positions per row (finished: all)
        hint = self.drafter.host_hint(state)  # None, a 0-dim (-> int) or a 1-D (-> list) long tensor
        head = torch.stack([state.active.sum(), done.sum(), bad.long()])
        values = torch.cat([head, hint.reshape(-1).long()]).tolist() if hint is not None else head.tolist() + [0]
        n_active, n_done, n_bad = values[:3]
        self._hint = values[3] if hint is None or hint.dim() == 0 else values[3:]
        if n_bad:
            raise ValueError(f"the model returned logits that are not a distribution (NaN, or no finite value) "
                             f"after {state.step} forward passes; with fp16 weights try bf16 or fp32")
        if progress is not None:
            progress(n_done, state.batch * N)
        if n_active == 0:
            return False
        if interrupt is not None and interrupt():
            raise GenerationInterrupted(f"generation interrupted after {state.step} forward passes")
        return True

    def _forward(self, session: Session, tree: DraftTree):
        """The model's forward of the tree and every node's target p (the next position's)."""
        if self.timed:  # eager only: the forward's share of the step (compiled, the step is one graph)
            self._sync()
            tf = time.perf_counter()
        with self.target_mode():
            out = self.model.forward(session, tree.tokens, tree.parents)
        if self.timed:
            self._sync()
            self.forward_s += time.perf_counter() - tf
        return out, target_probs(out.cond, out.uncond, self.sampling)

    def _commit(self, session: Session, state: LoopState, verdict: Verdict, at_step):
        """Write the accepted drafts and the new pending token, keep the accepted path's KV, move
        the frontier. Returns a flag (a committed position's target was not a distribution) and
        the tokens each row settled."""
        active, frontier, N = state.active, state.frontier, self.model.geometry.seq_len
        n_acc = torch.where(active, verdict.n_accepted, 0)
        width = verdict.tokens.shape[1]
        slot = torch.arange(width, device=state.device)
        new_f = frontier + n_acc + 1
        tpos = frontier[:, None] + 1 + slot  # positions of p_path's targets
        newly = (slot[None] <= n_acc[:, None]) & active[:, None]
        state.write_tokens(tpos[:, :-1], newly[:, :-1], verdict.tokens[:, 1:])  # accepted drafts
        forced_next = self.layout.forced[new_f]
        pending = torch.where(forced_next >= 0, forced_next, verdict.pending)
        state.write_tokens(new_f[:, None], active[:, None], pending[:, None])
        r = state.rows[:, None].expand_as(tpos)
        state.step_count = state.step_count + 1
        at_step[r, torch.where(newly, tpos, state.spare)] = state.step_count
        self.model.commit(session, verdict.path, torch.where(active, n_acc + 1, 0))
        committed = torch.where(active, new_f.clamp(max=N - 1) - frontier, 0)
        state.frontier = torch.where(active, new_f, frontier)
        return (invalid_rows(verdict.p_path) & newly).any(), committed

    # -- statistics ----------------------------------------------------------------------------
    def _stats(self, log: StepLog, at_step, nfe, prefill_s, decode_s, forward_s):
        geo, B, dev = self.model.geometry, self.batch, self.model.device
        if log.committed:
            committed = torch.stack(log.committed, 1).cpu()  # [B, steps]
            active = torch.stack(log.active, 1).cpu()
        else:
            committed = torch.zeros(B, 0, dtype=torch.long)
            active = torch.zeros(B, 0, dtype=torch.bool)
        steps = active.sum(1).tolist()
        lengths = committed[active]
        hist = {}
        for k, c in zip(*torch.unique(lengths, return_counts=True)):
            hist[int(k)] = int(c)
        img_pos = geo.image_positions().to(at_step.device)
        maps = at_step[:, img_pos].view(B, geo.height, geo.width).cpu().tolist()
        n_img = geo.num_image_tokens
        # the prefill forward yields the first token, so AR compresses exactly 1.0
        compression = sum(n_img / (s + 1) for s in steps) / B
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
        return GenerationStats(
            backend=self.backend.name, params=self.backend.params(), batch=B,
            image_tokens=n_img, forced_tokens=geo.seq_len - n_img, nfe=nfe, steps=steps,
            step_compression=compression,
            mean_accepted_length=float(lengths.float().mean()) if lengths.numel() else 0.0,
            accepted_length_histogram=hist, prefill_s=prefill_s, decode_s=decode_s,
            latency_s=prefill_s + decode_s, forward_s=forward_s,
            overhead_s=None if forward_s is None else max(decode_s - forward_s, 0.0),
            peak_memory_bytes=peak, accepted_at_step=maps, lossy=not self.drafter.lossless,
            backend_report=self.drafter.report(), reproducible=self.reproducible,
            same_image_guarantee=self.same_image_guarantee,
            compile=None if self.compile_stats is None else self.compile_stats.to_dict(),
            sampling=dataclasses.asdict(self.sampling),
        )
