"""The speculative engine: one loop for every backend, in named phases.

    prefill -> (host read -> plan -> decode step)* -> statistics
    decode step: propose (drafter) -> forward (model) -> verify (samplers/verification/)
    -> commit (engine) -> observe (drafter)

Per image row b the engine keeps ``frontier[b]``: the position of the *pending* token, the last committed token whose KV
is not cached yet; every step commits at least one token, and AR is the same loop with no drafts. Forced tokens, the
one host read per step and the batch: docs/ARCHITECTURE.md, "The engine loop".
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from ..model_loaders.contract import ARImageModel, EncodedPrompt
from ..model_loaders.precision import batch_invariant
from .backends import SCHEMAS, BackendConfig
from .compiled_step.step_graphs import step_graphs
from .decode_step import StepLog, decode_step
from .drafters.base import AdaptiveDrafter, Drafter
from .forward_costs import calibrate
from .randomness import Draws, PositionNoise, make_generator
from .run_state import LoopState, RunContext, SequenceLayout
from .stats import generation_stats
from .target import SamplingParams, invalid_rows, target_probs


class GenerationInterrupted(Exception):
    """Raised when the caller's interrupt check fires; the model stays usable."""


class SpeculativeEngine:
    """One generation's loop: its context (`ctx`, made here), its drafter beside it, and the model's compiled step."""

    def __init__(self, model: ARImageModel, backend: BackendConfig, sampling: SamplingParams, seed: int, batch: int,
                 profile: bool = False, compile: bool = False, reproducible: Optional[bool] = None,
                 pin_width: Optional[int] = None):
        # compile=True: the model's compiled decode step, one static graph per plan (compiled_step/step_graphs.py)
        self.step_graphs = step_graphs(model, decode_step) if compile else None
        self.drafter: Drafter = backend.make_drafter(model, sampling)
        if reproducible and not self.drafter.lossless:
            raise ValueError(f"reproducible=True (same_image_as_ar) needs a lossless backend: this {backend.name} "
                             f"configuration is lossy (relaxed acceptance keeps drafts AR would not sample); turn "
                             f"relaxed off, or same_image_as_ar (reproducible) off")
        # "same image as AR": verification by agreement (docs/REPRODUCIBLE.md); None: on for a lossless backend
        reproducible = self.drafter.lossless if reproducible is None else reproducible
        dev, V = model.device, model.geometry.vocab_size
        layout = SequenceLayout.build(model.geometry, self.drafter.slack, dev)
        self.ctx = RunContext(
            model=model, sampling=sampling, layout=layout, batch=batch, vocab_size=V, device=dev, seed=seed,
            reproducible=reproducible, compiled=compile,
            position_noise=PositionNoise(seed, batch, layout.ext, V, dev, greedy=sampling.temperature == 0),
            profile=profile, backend=backend.name, backend_params=tuple(backend.params().items()),
            # batch-invariant or shape-pinned target forwards where the same image needs them
            same_image=batch_invariant.same_image_plan(model, reproducible, backend.name, self.drafter.node_budget,
                                                       pin_width))

    # -- the loop ------------------------------------------------------------------------------
    @torch.inference_mode()  # the whole generation: tensors made in one step are the next step's graph inputs
    def run(self, prompt: EncodedPrompt, progress: Optional[Callable] = None,
            interrupt: Optional[Callable[[], bool]] = None, preview=None):
        ctx, dev = self.ctx, self.ctx.device
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        timed = ctx.profile or dev.type != "cuda"  # steps synchronised and timed (CUDA: only when profiling)
        adaptive = self.drafter if isinstance(self.drafter, AdaptiveDrafter) else None
        log = StepLog(self.drafter, adaptive, sync, timed=timed and not ctx.compiled)  # eager: the forward timed apart
        if dev.type == "cuda":  # peak memory of this generation, not of the process so far
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        session, state, bad = self._prefill(prompt)
        shapes = adaptive.cost_shapes() if adaptive is not None else {}
        if shapes:  # an adaptive drafter's choices weigh this machine's forward costs
            adaptive.set_costs(calibrate(ctx, session, sync, shapes))
        sync()
        t1 = time.perf_counter()
        at_step = torch.zeros_like(state.seq)
        graphs = None if self.step_graphs is None else self.step_graphs.begin(ctx, log)
        try:
            self._loop(log, graphs, state, session, at_step, bad, progress, interrupt, preview)
        finally:
            compile_report = None if graphs is None else graphs.end()  # this generation's compiles, not the process's
        sync()
        stats = generation_stats(ctx, log, at_step, (t1 - t0, time.perf_counter() - t1), compile_report)
        return self._tokens_out(state), stats

    def _tokens_out(self, state: LoopState) -> torch.Tensor:
        """The generation's tokens, a copy: the sequence may live in a buffer home (CUDA graphs,
        compiled_step/graph_buffers.py) that the next generation on the model overwrites."""
        return state.seq[:, : self.ctx.model.geometry.seq_len].clone()

    def _loop(self, log: StepLog, graphs, state, session, at_step, bad, progress, interrupt, preview) -> None:
        """The decode steps: host read, plan, the step (compiled or eager), until every row is done."""
        step = decode_step if graphs is None else graphs.step
        while self._host_read(log, state, bad, progress, interrupt):
            if preview is not None and preview.due():  # a host clock read; the copy only when due
                N = self.ctx.model.geometry.seq_len
                preview(state.seq[:, :N], torch.where(state.active, state.frontier + 1, N), at_step)
            plan = self.drafter.plan(state, log.hint)
            step_bad, committed, active = step(log, plan, state, session, at_step)
            state.step += 1
            bad = bad | step_bad
            log.committed.append(committed)
            log.active.append(active)

    # -- phases --------------------------------------------------------------------------------
    def _prefill(self, prompt):
        """Prefill, the first token (a sample of position 0's target), and the drafter's start."""
        ctx = self.ctx
        model, B, dev, layout = ctx.model, ctx.batch, ctx.device, ctx.layout
        width = self._forward_width(prompt)
        # compiled: the session laid out for the compiled decode step, which captures its forward and commit
        with ctx.same_image.mode():
            session = model.start(prompt, B, ctx.sampling.uses_cfg, draft_capacity=width + 1,
                                  captured=ctx.compiled)
        first = session.first
        p0 = target_probs(first.cond[:, 0], None if first.uncond is None else first.uncond[:, 0], ctx.sampling)
        known = torch.where(layout.forced >= 0, layout.forced, 0)  # forced tokens in place, 0 elsewhere
        state = LoopState(
            ctx=ctx, draws=Draws(make_generator(ctx.seed, dev), dev), rows=torch.arange(B, device=dev),
            frontier=torch.zeros(B, dtype=torch.long, device=dev), active=torch.ones(B, dtype=torch.bool, device=dev),
            # one spare column past the end: masked-out writes land there (a single index_put)
            seq=torch.cat([known, known.new_zeros(1)]).expand(B, layout.ext + 1).clone(),
            step_count=torch.zeros((), dtype=torch.long, device=dev))
        x0 = state.sample_at(p0, state.frontier)
        state.write_tokens(state.frontier[:, None], state.active[:, None], x0[:, None])
        state.draft = self.drafter.start(state, first, p0)
        state.active = state.frontier < layout.last_img
        return session, state, invalid_rows(p0).any()

    def _forward_width(self, prompt) -> int:
        """The tokens of the widest forward; a tree that does not fit in the model's positions fails before the
        prefill, naming the backend parameters that set its size and the largest node budget this model allows."""
        ctx = self.ctx
        model, limit, width = ctx.model, ctx.model.max_positions, ctx.same_image.pin_width or self.drafter.node_budget
        if limit is None:
            return width
        P = max(len(prompt.cond), len(prompt.uncond) if ctx.sampling.uses_cfg else 0)
        if model.positions_needed(P, width + 1) > limit:
            allowed = limit - model.positions_needed(P, 1)
            names = SCHEMAS[ctx.backend].size_params
            sizes = [f"{n}={dict(ctx.backend_params)[n]}" for n in names]
            raise ValueError(f"{ctx.backend} with {', '.join(sizes)} needs {width} draft slots per "
                             f"forward, but this model ({limit} positions, a {P}-token prompt and a "
                             f"{model.geometry.seq_len}-token image) allows at most {max(allowed, 0)}: lower "
                             f"{' or '.join(names) or 'the tree size'}")
        return width

    def _host_read(self, log: StepLog, state, bad, progress, interrupt) -> bool:
        """The step's one read of device values: False when every row is done."""
        N = self.ctx.model.geometry.seq_len
        done = torch.where(state.active, state.frontier + 1, N)  # committed positions per row (finished: all)
        hint = self.drafter.host_hint(state)  # None, a 0-dim (-> int) or a 1-D (-> list) long tensor
        head = torch.stack([state.active.sum(), done.sum(), bad.long()])
        values = torch.cat([head, hint.reshape(-1).long()]).tolist() if hint is not None else head.tolist() + [0]
        n_active, n_done, n_bad = values[:3]
        log.hint = values[3] if hint is None or hint.dim() == 0 else values[3:]
        if n_bad:
            raise ValueError(f"the model returned logits that are not a distribution (NaN, or no finite value) "
                             f"after {state.step} forward passes; with fp16 weights try bf16 or fp32")
        if progress is not None:
            progress(n_done, state.ctx.batch * N)
        if n_active == 0:
            return False
        if interrupt is not None and interrupt():
            raise GenerationInterrupted(f"generation interrupted after {state.step} forward passes")
        return True
