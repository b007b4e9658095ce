"""The speculative engine: one loop for every backend, in named phases.

    prefill -> (host read -> plan -> decode step)* -> statistics
    decode step: propose (drafter) -> forward (model) -> verify (samplers/verification/)
    -> commit (engine) -> observe (drafter)

Per image row b the engine keeps ``frontier[b]``: the position of the *pending* token, the last committed token whose KV
is not cached yet. The drafter proposes a tree whose node 0 is the pending token; the forward's output at node i is the
target p of the position after it. Verification accepts a path of drafts; the token after it (a residual sample, or a
fresh sample of p when the whole path passed) becomes the new pending token. So every step commits at least one token,
and AR is the same loop with no drafts.

Forced structure tokens (row ends) are never sampled: the engine writes them, and drafters put them in their trees as
always-accepted nodes, so they never cost a forward of their own.

Everything is batched over image rows with fixed shapes; a step reads one small tensor back to the host (rows still
running, tokens done, the drafter's hint, a bad-logits flag), nothing per token. From that read the drafter `plan`s the
step (its shapes) on the host; everything after is device work (`decode_step`), which `compile=True` runs as one
compiled graph per plan (compiled_step/).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..model_loaders.contract import ARImageModel, EncodedPrompt, Session
from ..model_loaders.precision import batch_invariant
from .backends import BackendConfig
from .forward_costs import calibrate
from .compiled_step.step_graphs import step_graphs
from .drafters.base import Drafter
from .proposal import DraftTree, Verdict
from .randomness import Draws, PositionNoise, make_generator
from .run_state import LoopState, RunContext, SequenceLayout
from .stats import generation_stats
from .target import SamplingParams, invalid_rows, target_probs
from .verification.step import verify


class GenerationInterrupted(Exception):
    """Raised when the caller's interrupt check fires; the model stays usable."""


@dataclass
class Run:
    """One generation's values besides the loop's tensors (made by `SpeculativeEngine.run`)."""

    sync: Callable[[], None]  # waits for the device (CUDA), else nothing
    timed: bool  # eager forwards timed apart from the rest of the step (CPU, or profile)
    forward_s: float = 0.0  # seconds inside model forwards (when timed)
    hint: Any = None  # the drafter's value from the last host read
    committed: list = field(default_factory=list)  # per step: [B] tokens each row settled
    active: list = field(default_factory=list)  # per step: [B] rows that took part


def decode_step(run: Run, plan, state: LoopState, session: Session, at_step: torch.Tensor):
    """One decode step after its plan, every phase on the device: propose -> forward -> target -> verify -> commit ->
    observe. No host read, no shape that depends on a value: with compile=True it runs as one graph per plan. It writes
    the loop's tensors (`state`: seq, frontier, the drafter's state), the session's cache and `at_step`; returns
    (bad-logits flag, [B] tokens each row settled, [B] rows that took part)."""
    drafter, active = state.ctx.drafter, state.active
    tree = drafter.propose(state, plan)
    out, p = forward(run, session, state.ctx, tree)
    verdict = verify(state, tree, p)
    previous = state.frontier
    bad, committed = commit(session, state, verdict, at_step)
    state.draft = drafter.observe(state, plan, tree, verdict, p, out, previous)
    state.active = state.frontier < state.ctx.layout.last_img
    return bad, committed, active


def forward(run: Run, session: Session, ctx: RunContext, tree: DraftTree):
    """The model's forward of the tree and every node's target p (the next position's)."""
    if run.timed:  # eager only: the forward's share of the step (compiled, the step is one graph)
        run.sync()
        tf = time.perf_counter()
    with ctx.target_mode():
        if ctx.pin_width is None:
            out = ctx.model.forward(session, tree.tokens, tree.parents)
        else:
            out = batch_invariant.pinned_forward(ctx.model, session, tree.tokens, tree.parents, ctx.pin_width)
    if run.timed:
        run.sync()
        run.forward_s += time.perf_counter() - tf
    return out, target_probs(out.cond, out.uncond, ctx.sampling)


def commit(session: Session, state: LoopState, verdict: Verdict, at_step):
    """Write the accepted drafts and the new pending token, keep the accepted path's KV, move the frontier. Returns a
    flag (a committed position's target was not a distribution) and the tokens each row settled."""
    active, frontier, model = state.active, state.frontier, state.ctx.model
    n_acc = torch.where(active, verdict.n_accepted, 0)
    width = verdict.tokens.shape[1]
    slot = torch.arange(width, device=state.ctx.device)
    new_f = frontier + n_acc + 1
    tpos = frontier[:, None] + 1 + slot  # positions of p_path's targets
    newly = (slot[None] <= n_acc[:, None]) & active[:, None]
    state.write_tokens(tpos[:, :-1], newly[:, :-1], verdict.tokens[:, 1:])  # accepted drafts
    forced_next = state.ctx.layout.forced[new_f]
    pending = torch.where(forced_next >= 0, forced_next, verdict.pending)
    state.write_tokens(new_f[:, None], active[:, None], pending[:, None])
    r = state.rows[:, None].expand_as(tpos)
    state.step_count = state.step_count + 1
    at_step[r, torch.where(newly, tpos, state.spare)] = state.step_count
    model.commit(session, verdict.path, torch.where(active, n_acc + 1, 0))
    committed = torch.where(active, new_f.clamp(max=model.geometry.seq_len - 1) - frontier, 0)
    state.frontier = torch.where(active, new_f, frontier)
    return (invalid_rows(verdict.p_path) & newly).any(), committed


class SpeculativeEngine:
    def __init__(self, model: ARImageModel, backend: BackendConfig, sampling: SamplingParams, seed: int, batch: int,
                 profile: bool = False, compile: bool = False, reproducible: Optional[bool] = None,
                 pin_width: Optional[int] = None):
        self.model, self.backend, self.sampling, self.seed, self.batch = model, backend, sampling, seed, batch
        self.profile, self.compile = profile, compile
        # compile=True: the model's compiled decode step, one static graph per plan (compiled_step/step_graphs.py)
        self.step_graphs = step_graphs(model, decode_step) if compile else None
        self.drafter: Drafter = backend.make_drafter(model, sampling)
        if reproducible and not self.drafter.lossless:
            raise ValueError(f"reproducible=True (same_image_as_ar) needs a lossless backend: this {backend.name} "
                             f"configuration is lossy (relaxed acceptance keeps drafts AR would not sample); turn "
                             f"relaxed off, or same_image_as_ar (reproducible) off")
        # "same image as AR": verification by agreement (docs/REPRODUCIBLE.md); None: on for a lossless backend
        self.reproducible = self.drafter.lossless if reproducible is None else reproducible
        # batch-invariant target forwards where the same image needs it (model_loaders/precision/batch_invariant.py)
        self.target_mode, self.same_image_guarantee, self.same_image_reason = batch_invariant.target_forward_mode(
            model, self.reproducible, pin_width)
        # shape pinning: every target forward at one width (`pin_width`, else batch_invariant.PINNED_WIDTH)
        self.pin_width = self._pin_width(pin_width) if pin_width is not None or \
            self.target_mode is batch_invariant.ShapePinned else None
        if self.pin_width is not None:
            self.same_image_reason += f" (every forward at {self.pin_width} tokens)"
            if pin_width is None and self.pin_width > batch_invariant.PINNED_WIDTH:  # AR pads to PINNED_WIDTH only
                self.same_image_guarantee = batch_invariant.SameImage.NOT_GUARANTEED
                self.same_image_reason = (f"{backend.name}'s forwards of {self.pin_width} tokens are wider than the "
                                          f"pinned width {batch_invariant.PINNED_WIDTH}")
        self.width = self.pin_width or self.drafter.node_budget  # tokens of the widest forward

    def _pin_width(self, asked: Optional[int]) -> int:
        """The width of every forward: `asked` (checked), else the product's pinned width (or the backend's widest
        forward when it is wider)."""
        budget = self.drafter.node_budget
        if asked is None:
            return max(budget, batch_invariant.PINNED_WIDTH)
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < budget:
            raise ValueError(f"pin_width must be an int >= {budget} ({self.backend.name}'s widest forward), got "
                             f"{asked!r}")
        if not self.reproducible:
            raise ValueError("pin_width pins the forwards of the same-image mode: it needs reproducible "
                             "(same_image_as_ar) on")
        return asked

    # -- the loop ------------------------------------------------------------------------------
    @torch.inference_mode()  # the whole generation: tensors made in one step are the next step's graph inputs
    def run(self, prompt: EncodedPrompt, progress: Optional[Callable] = None,
            interrupt: Optional[Callable[[], bool]] = None, preview=None):
        dev = self.model.device
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        timed = self.profile or dev.type != "cuda"  # steps synchronised and timed (CUDA: only when profiling)
        run = Run(sync, timed=timed and not self.compile)  # eager: the forward timed apart; compiled: the graphs
        if dev.type == "cuda":  # peak memory of this generation, not of the process so far
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        session, state, bad = self._prefill(prompt)
        calibrate(self.model, self.drafter, session, self.batch, self.compile, sync, self.target_mode, self.pin_width)
        sync()
        t1 = time.perf_counter()
        at_step = torch.zeros_like(state.seq)
        graphs = None if self.step_graphs is None else self.step_graphs.begin(state.ctx, timed)
        try:
            self._loop(run, graphs, state, session, at_step, bad, progress, interrupt, preview)
        finally:
            compiled = None if graphs is None else graphs.end()  # this generation's compiles, not the process's
        sync()
        stats = generation_stats(state.ctx, run, at_step, state.step, t1 - t0, time.perf_counter() - t1, compiled,
                                 self.same_image_guarantee, self.same_image_reason)
        return self._tokens_out(state), stats

    def _tokens_out(self, state: LoopState) -> torch.Tensor:
        """The generation's tokens, a copy: the sequence may live in a buffer home (CUDA graphs,
        compiled_step/graph_buffers.py) that the next generation on the model overwrites."""
        return state.seq[:, : self.model.geometry.seq_len].clone()

    def _loop(self, run: Run, graphs, state, session, at_step, bad, progress, interrupt, preview) -> None:
        """The decode steps: host read, plan, the step (compiled or eager), until every row is done."""
        step = decode_step if graphs is None else graphs.step
        while self._host_read(run, state, bad, progress, interrupt):
            if preview is not None and preview.due():  # a host clock read; the copy only when due
                N = self.model.geometry.seq_len
                preview(state.seq[:, :N], torch.where(state.active, state.frontier + 1, N), at_step)
            plan = self.drafter.plan(state, run.hint)
            step_bad, committed, active = step(run, plan, state, session, at_step)
            state.step += 1
            bad = bad | step_bad
            run.committed.append(committed)
            run.active.append(active)

    # -- phases --------------------------------------------------------------------------------
    def _prefill(self, prompt):
        """Prefill, the first token (a sample of position 0's target), and the drafter's start."""
        model, B, V, dev = self.model, self.batch, self.model.geometry.vocab_size, self.model.device
        self._check_positions(prompt)
        # compiled: the session laid out for the compiled decode step, which captures its forward and commit
        with self.target_mode():
            session = model.start(prompt, B, self.sampling.uses_cfg, draft_capacity=self.width + 1,
                                  captured=self.compile)
        first = session.first
        p0 = target_probs(first.cond[:, 0], None if first.uncond is None else first.uncond[:, 0], self.sampling)
        layout = SequenceLayout.build(model.geometry, self.drafter.slack, dev)
        known = torch.where(layout.forced >= 0, layout.forced, 0)  # forced tokens in place, 0 elsewhere
        ctx = RunContext(model=model, sampling=self.sampling, layout=layout, batch=B, vocab_size=V, device=dev,
                         reproducible=self.reproducible, position_noise=PositionNoise(self.seed, B, layout.ext, V, dev),
                         compiled=self.compile, backend=self.backend, drafter=self.drafter,
                         target_mode=self.target_mode, pin_width=self.pin_width)
        state = LoopState(
            ctx=ctx, draws=Draws(make_generator(self.seed, dev), dev), rows=torch.arange(B, device=dev),
            frontier=torch.zeros(B, dtype=torch.long, device=dev), active=torch.ones(B, dtype=torch.bool, device=dev),
            # one spare column past the end: masked-out writes land there (a single index_put)
            seq=torch.cat([known, known.new_zeros(1)]).expand(B, layout.ext + 1).clone(),
            step_count=torch.zeros((), dtype=torch.long, device=dev))
        x0 = state.sample_at(p0, state.frontier)
        state.write_tokens(state.frontier[:, None], state.active[:, None], x0[:, None])
        state.draft = self.drafter.start(state, first, p0)
        state.active = state.frontier < layout.last_img
        return session, state, invalid_rows(p0).any()

    def _check_positions(self, prompt) -> None:
        """A tree that does not fit in the model's positions fails before the prefill, naming the backend parameters
        that set its size and the largest node budget this model allows."""
        limit = self.model.max_positions
        if limit is None:
            return
        P = max(len(prompt.cond), len(prompt.uncond) if self.sampling.uses_cfg else 0)
        budget = self.width
        need = self.model.positions_needed(P, budget + 1)
        if need > limit:
            allowed = limit - self.model.positions_needed(P, 1)
            names = self.backend.schema.size_params
            sizes = [f"{n}={getattr(self.backend.typed_params, n)}" for n in names]
            raise ValueError(f"{self.backend.name} with {', '.join(sizes)} needs {budget} draft slots per "
                             f"forward, but this model ({limit} positions, a {P}-token prompt and a "
                             f"{self.model.geometry.seq_len}-token image) allows at most {max(allowed, 0)}: lower "
                             f"{' or '.join(names) or 'the tree size'}")

    def _host_read(self, run: Run, state, bad, progress, interrupt) -> bool:
        """The step's one read of device values: False when every row is done."""
        N = self.model.geometry.seq_len
        done = torch.where(state.active, state.frontier + 1, N)  # committed positions per row (finished: all)
        hint = self.drafter.host_hint(state)  # None, a 0-dim (-> int) or a 1-D (-> list) long tensor
        head = torch.stack([state.active.sum(), done.sum(), bad.long()])
        values = torch.cat([head, hint.reshape(-1).long()]).tolist() if hint is not None else head.tolist() + [0]
        n_active, n_done, n_bad = values[:3]
        run.hint = values[3] if hint is None or hint.dim() == 0 else values[3:]
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
