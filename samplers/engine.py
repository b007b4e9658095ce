"""The speculative engine: one loop for every backend.

    propose (drafts already in `seq`) -> model.forward(pending + drafts) -> verify -> commit

Per image row b the engine keeps ``frontier[b]``: the position of the *pending* token, the last
committed token whose KV is not cached yet. A step feeds the chain
``[pending, draft_1, ..., draft_{T-1}]`` (consecutive sequence positions); the output at slot i
is the target p of position ``frontier + i + 1``. Verification accepts a prefix of the drafts;
the token after it (the residual sample at the first rejection, or a fresh sample from p when
every enabled draft passed) becomes the new pending token. So every step commits at least one
token, and AR is the same loop with no drafts.

Forced structure tokens (row ends) sit in the chain like drafts whose p is one-hot at them: they
are always accepted and never cost a forward of their own. The window counts image drafts only.

Everything is batched over image rows with fixed shapes; a step reads one small tensor back to
the host (how many rows are still running), nothing per token.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from ..model_loaders.contract import ARImageModel, EncodedPrompt
from .backends import Backend
from .randomness import exponential_noise, gumbel_key, make_generator, position_gumbel, sample_by_race
from .stats import GenerationStats
from .target import SamplingParams, invalid_rows, target_probs
from .verify import gumbel_coupling, one_hot, verify_candidates, verify_chain


GUMBEL_TABLE_BYTES = 1 << 28  # 256 MiB: a 48x48 image over 8192 codes needs 77 MB per image row


class GenerationInterrupted(Exception):
    """Raised when the caller's interrupt check fires; the model stays usable."""


def _slot_count(forced: torch.Tensor, window: int) -> int:
    """Slots per forward: the pending token plus the longest run of positions holding `window`
    image tokens (and the forced tokens between and right after them)."""
    n = forced.numel()
    count = (forced < 0).long().cumsum(0)  # image tokens at positions <= j
    last = torch.searchsorted(count, count + window, right=True) - 1  # last j with count <= count[c] + window
    last = last.clamp(max=n - 1)
    return int((last - torch.arange(n)).max()) + 1


class SpeculativeEngine:
    def __init__(self, model: ARImageModel, backend: Backend, sampling: SamplingParams, seed: int, batch: int,
                 profile: bool = False):
        self.model, self.backend, self.sampling, self.seed, self.B = model, backend, sampling, seed, batch
        self.profile = profile
        geo = model.geometry
        self.geo, self.N, self.V, self.L = geo, geo.seq_len, geo.vocab_size, backend.window
        dev = self.dev = model.device
        if backend.tree_width > geo.vocab_size:
            raise ValueError(f"tree_width must be in [1, {geo.vocab_size}] (the image vocabulary), got {backend.tree_width}")
        forced = geo.forced_tokens()
        if forced[0] >= 0:
            raise ValueError("the first sequence position must be an image token")
        self.T = min(_slot_count(forced, self.L), self.N)
        ext = self.N + self.T + 2  # room for slots that run past the end of the image
        f = torch.full((ext,), -2, dtype=torch.long)
        f[: self.N] = forced
        self.forced = f.to(dev)  # forced engine id, -1 image position, -2 beyond the image
        self.is_img = self.forced == -1
        img_pos = torch.where(f == -1, torch.arange(ext), torch.full_like(f, -1))
        prev = torch.cummax(img_pos, 0).values  # latest image position <= j
        self.prev_img = torch.cat([torch.tensor([-1]), prev[:-1]]).to(dev)  # latest image position < j
        self.last_img = int((f == -1).nonzero().max())
        self.Rb = geo.row_stride + self.T + 2  # ring of per-position distributions
        self.rows = torch.arange(batch, device=dev)
        # one spare column of `seq` and one spare slot of `dist` past the end: masked-out writes
        # land there, so a masked write is a single index_put with no read-back (fixed shapes)
        self.spare = ext
        known = torch.where(self.forced >= 0, self.forced, 0)  # forced tokens in place, 0 elsewhere
        self.seq = torch.cat([known, known.new_zeros(1)]).expand(batch, ext + 1).clone()
        self.dist = torch.zeros(batch, self.Rb + 1, self.V, device=dev)
        self.gen = make_generator(seed, dev)
        self.gkey = gumbel_key(seed)
        # Gumbel coupling: the noise of every (row, position) computed once per generation when it
        # fits in GUMBEL_TABLE_BYTES (a step would otherwise hash [B, T, V] again; over a whole
        # image steps * T >= positions, so the table is also less work). Same values either way.
        self.gumbel_table = None
        if backend.refine == "gumbel" and batch * ext * self.V * 4 <= GUMBEL_TABLE_BYTES:
            self.gumbel_table = position_gumbel(self.gkey, self.rows[:, None], torch.arange(ext, device=dev)[None], self.V)
        self.parents = [-1] + list(range(self.T - 1))
        # proactive drafting: K-1 branches of D nodes after the chain, each rooted at the pending slot
        self.K, self.D = backend.tree_width, backend.tree_depth
        self.tree_parents = list(self.parents)
        for _ in range(self.K - 1):
            for d in range(self.D):
                self.tree_parents.append(0 if d == 0 else len(self.tree_parents) - 1)
        self.T_tree = len(self.tree_parents)

    # -- small helpers ----------------------------------------------------------------------
    def _noise(self, *shape):
        return exponential_noise(shape, self.gen, self.dev)

    def _write(self, pos, mask, tokens=None, dists=None):
        """Masked writes of tokens into `seq` and distributions into the ring `dist` (positions
        in one call are distinct per row; masked-out entries go to the spare column / slot)."""
        r = self.rows[:, None].expand_as(pos)
        if tokens is not None:
            self.seq[r, torch.where(mask, pos, self.spare)] = tokens
        if dists is not None:
            self.dist[r, torch.where(mask, pos % self.Rb, self.Rb)] = dists

    # -- drafting of positions that enter the window -----------------------------------------
    def _init(self, pos, need):
        """Draft positions `pos` [B, K] (consecutive per row) where `need`; record their q."""
        if self.L == 0:  # AR drafts nothing
            return
        need = need & self.is_img[pos]
        B, K = pos.shape
        V, strat = self.V, self.backend.init
        # the last image position before the first one to draft: the source of left-initialisation
        first = torch.where(need, pos, pos[:, -1:]).min(-1).values
        left = self.prev_img[first].clamp(min=0)
        if strat == "random":
            x = torch.randint(V, (B, K), generator=self.gen, device=self.dev)
            self._write(pos, need, x, torch.full((B, K, V), 1.0 / V, device=self.dev))
            return
        if strat.endswith("_left"):
            chunks = [(0, K)]
        else:
            step = self.geo.row_stride
            chunks = [(s, min(s + step, K)) for s in range(0, K, step)]
        for s, e in chunks:  # sources of a chunk lie before it (row above, or the left source)
            p = pos[:, s:e]
            src = left[:, None].expand_as(p)
            if strat.endswith("_above"):
                above = p - self.geo.row_stride
                src = torch.where(above >= 0, above, src)
            if strat.startswith("repeat"):
                x = self.seq.gather(1, src).clamp(0, V - 1)  # clamp: sources of masked-out slots may be structure
                q = one_hot(x, V)
            else:
                q = self.dist[self.rows[:, None], src % self.Rb]
                x = sample_by_race(q, self._noise(B, e - s, V))
            self._write(p, need[:, s:e], x, q)

    # -- the loop --------------------------------------------------------------------------
    def run(self, prompt: EncodedPrompt, progress: Optional[Callable] = None,
            interrupt: Optional[Callable[[], bool]] = None):
        B, T, N, V, dev = self.B, self.T, self.N, self.V, self.dev
        sync = torch.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        timed = self.profile or self.dev.type != "cuda"
        if dev.type == "cuda":  # peak memory of this generation, not of the process so far
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        session = self.model.start(prompt, B, self.sampling.uses_cfg, draft_capacity=self.T_tree + 1)
        p0 = target_probs(session.first.cond[:, 0], None if session.first.uncond is None else session.first.uncond[:, 0],
                          self.sampling)
        x0 = sample_by_race(p0, self._noise(B, V))
        bad = invalid_rows(p0).any()  # logits that are not a distribution (read with the step's host read)
        frontier = torch.zeros(B, dtype=torch.long, device=dev)
        self._write(frontier[:, None], torch.ones(B, 1, dtype=torch.bool, device=dev), x0[:, None], p0[:, None])
        sync()
        t1 = time.perf_counter()
        drafted = frontier.clone()  # last position that holds a draft
        self._init(frontier[:, None] + torch.arange(1, T, device=dev), torch.ones(B, T - 1, dtype=torch.bool, device=dev))
        drafted = drafted + T - 1
        at_step = torch.zeros(B, self.seq.shape[1], dtype=torch.long, device=dev)
        in_tree = torch.zeros(B, dtype=torch.bool, device=dev)  # rows whose next draft is a tree
        committed_log, active_log = [], []
        forward_s, nfe = 0.0, 0
        slot = torch.arange(T, device=dev)
        while True:
            active = frontier < self.last_img
            done = torch.where(active, frontier + 1, N)  # committed positions per row (finished: all)
            n_active, n_done, n_tree, n_bad = torch.stack([active.sum(), done.sum(), (in_tree & active).sum(),
                                                           bad.long()]).tolist()
            # ^ the step's one host read
            if n_bad:
                raise ValueError(f"the model returned logits that are not a distribution (NaN, or no finite value) "
                                 f"after {nfe} forward passes; with fp16 weights try bf16 or fp32")
            if progress is not None:
                progress(n_done, B * N)
            if n_active == 0:
                break
            if interrupt is not None and interrupt():
                raise GenerationInterrupted(f"generation interrupted after {nfe} forward passes")
            tree_step = n_tree > 0
            pos = frontier[:, None] + slot  # [B, T]: pending, then the chain of drafts
            tokens = self.seq.gather(1, pos)
            if tree_step:  # proactive drafting: K-1 extra branches of depth D under the pending token
                tokens = torch.cat([tokens, self.branch_tok.flatten(1)], 1)
            if timed:
                sync(); tf = time.perf_counter()
            out = self.model.forward(session, tokens, self.tree_parents if tree_step else self.parents)
            if timed:
                sync(); forward_s += time.perf_counter() - tf
            nfe += 1
            p_all = target_probs(out.cond, out.uncond, self.sampling)  # slot i's output: target of its next position
            dpos = pos[:, 1:]
            q = self.dist[self.rows[:, None], dpos % self.Rb]
            forced = self.forced[dpos] >= 0
            enabled = (self.is_img[dpos].long().cumsum(-1) <= self.L) & (self.forced[dpos] != -2)
            noise = self._noise(B, T, V)  # noise[:, i-1] serves position frontier+i
            u = torch.rand(B, T - 1, generator=self.gen, device=dev)
            line, first = slot.expand(B, T), None
            if tree_step:
                line, first, k_star = self._verify_siblings(tokens, p_all, q[:, 0], in_tree, noise[:, 0], forced[:, 0])
            x_line, p = tokens, p_all
            if tree_step:  # the verified line: the chain, or the chosen branch after the pending token
                x_line, p = tokens.gather(1, line), p_all[self.rows[:, None], line]
            n_acc, mrs_out = verify_chain(p[:, :-1], q, x_line[:, 1:], u, noise[:, :-1], enabled, forced, first=first)
            if tree_step:
                n_acc = self._cap_branch_acceptance(n_acc, k_star)
            n_acc = torch.where(active, n_acc, 0)
            n_en = enabled.sum(-1)
            new_f = frontier + n_acc + 1
            n_committed = torch.where(active, new_f.clamp(max=N - 1) - frontier, 0)  # positions this step settles
            # the new pending token: correction after a rejection, else a fresh sample of p
            fresh_next = sample_by_race(p[self.rows, n_acc], noise[self.rows, n_acc])
            rejected = n_acc < n_en
            correction = torch.cat([mrs_out, fresh_next[:, None]], 1)[self.rows, n_acc]
            pending = torch.where(rejected, correction, fresh_next)
            pending = torch.where(self.forced[new_f] >= 0, self.forced[new_f], pending)
            # commit tokens and targets of positions frontier+1 .. new_f
            tpos = frontier[:, None] + 1 + slot  # positions of p's targets
            newly = (slot[None] <= n_acc[:, None]) & active[:, None]
            self._write(tpos[:, :-1], newly[:, :-1], x_line[:, 1:])  # accepted drafts (a branch's, after a tree)
            self._write(new_f[:, None], active[:, None], pending[:, None])
            self._write(tpos, newly, dists=p)
            bad = bad | (invalid_rows(p) & newly).any()
            r = self.rows[:, None].expand_as(tpos)
            at_step[r, torch.where(newly, tpos, self.spare)] = nfe
            # re-draft the positions verification did not reach (we have their stale-context p)
            refine = (tpos > new_f[:, None]) & (tpos <= (frontier + n_en + 1)[:, None]) & active[:, None] & self.is_img[tpos]
            y, q_y = self._redraft(p, tpos, mrs_out, noise)
            self._write(tpos, refine, y, q_y)
            self.model.commit(session, line if tree_step else None, torch.where(active, n_acc + 1, 0))
            frontier = torch.where(active, new_f, frontier)
            npos = frontier[:, None] + slot[1:]
            self._init(npos, (npos > drafted[:, None]) & active[:, None])
            drafted = torch.where(active, torch.maximum(drafted, frontier + T - 1), drafted)
            if self.K > 1:
                in_tree = rejected & active
                self._build_tree(frontier)
            committed_log.append(n_committed)
            active_log.append(active)
        sync()
        t2 = time.perf_counter()
        tokens = self.seq[:, :N]
        stats = self._stats(committed_log, active_log, at_step, nfe, t1 - t0, t2 - t1, forward_s if timed else None)
        return tokens, stats

    # -- proactive drafting (SJD-PAC) -------------------------------------------------------
    def _build_tree(self, frontier):
        """K-1 extra branches for positions frontier+1 .. frontier+D, built without a forward from
        the distributions recorded there. Depth 1: candidates drawn WITHOUT replacement from q
        at frontier+1, excluding the chain's own draft (which is the first draw); deeper nodes:
        drawn independently for every branch from that position's q."""
        B, K, D, V = self.B, self.K, self.D, self.V
        bpos = frontier[:, None] + torch.arange(1, D + 1, device=self.dev)  # [B, D]
        q = self.dist[self.rows[:, None], bpos % self.Rb]  # [B, D, V]
        first = self.seq.gather(1, bpos[:, :1]).clamp(0, V - 1)  # the chain's draft at depth 1
        keys = self._noise(B, V) / q[:, 0]  # exponential race keys: ascending order = draws w/o replacement
        keys = keys.scatter(1, first, float("inf"))
        order = keys.topk(K - 1, dim=-1, largest=False).indices  # [B, K-1], ascending: the first K-1 draws
        ok1 = torch.isfinite(keys.gather(1, order)) & (q[:, 0].gather(1, order) > 0)
        deeper = sample_by_race(q[:, None, 1:].expand(B, K - 1, D - 1, V), self._noise(B, K - 1, D - 1, V))
        tok = torch.cat([order[:, :, None], deeper], 2)  # [B, K-1, D]
        forced = self.forced[bpos]
        tok = torch.where(forced[:, None] >= 0, forced[:, None], tok)
        valid = (forced[:, None] != -2).expand(B, K - 1, D).clone()
        valid[:, :, 0] &= ok1 | (forced[:, None, 0] >= 0)
        self.branch_tok, self.branch_valid = tok, valid

    def _verify_siblings(self, tokens, p_all, q1, in_tree, noise1, forced1):
        """Depth 1 of a tree step: the chain's draft and the branches' first tokens are siblings
        drawn without replacement from q1; verify them in order. Returns the slot line of the
        branch verification continues on, and the depth-1 outcome (accepted, token)."""
        B, K, D, T = self.B, self.K, self.D, self.T
        cands = torch.cat([tokens[:, 1:2], self.branch_tok[:, :, 0]], 1).clamp(0, self.V - 1)  # [B, K]
        valid = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=self.dev),
                           self.branch_valid[:, :, 0] & in_tree[:, None]], 1)
        u = torch.rand(B, K, generator=self.gen, device=self.dev)
        k_star, token = verify_candidates(p_all[:, 0], cands, u, noise1, q=q1, valid=valid)
        k_star = torch.where(forced1, 0, k_star)  # a structure token: every branch holds it
        depth = torch.arange(T, device=self.dev)
        branch_slot = T + (k_star.clamp(min=1) - 1)[:, None] * D + depth[None] - 1
        on_branch = (k_star[:, None] >= 1) & (depth[None] >= 1) & (depth[None] <= D)
        line = torch.where(on_branch, branch_slot, depth[None])
        return line, (k_star >= 0, torch.where(k_star >= 0, tokens.gather(1, line[:, 1:2]).squeeze(1), token)), k_star

    def _cap_branch_acceptance(self, n_acc, k_star):
        """When a proactive branch (k >= 1) won depth 1, its line holds only D nodes of its own:
        the chain's nodes after them were computed in the chain's context, so their outputs (the
        p of positions D+2, ...) and their KV are wrong for this branch. Acceptance stops at D;
        the output of branch node D (the exact p of position D+1) then yields the pending token:
        the MRS output there (a sample of that p whichever draft it verified), or a fresh sample."""
        return torch.where(k_star >= 1, n_acc.clamp(max=self.D), n_acc)

    def _redraft(self, p, tpos, mrs_out, noise):
        """Next step's draft at each target position (used where verification stopped short) and
        the q it is distributed as: always the new p, whether drawn independently or coupled."""
        return self._coupled_draft(p, tpos, mrs_out, noise), p

    def _coupled_draft(self, p, tpos, mrs_out, noise):
        fresh = sample_by_race(p, noise)
        kind, alpha = self.backend.refine, self.backend.coupling_strength
        if kind == "independent":
            return fresh
        if kind == "maximal":
            # slots 1..T-1 had an old draft: MRS output couples it with the new p; the position
            # after the last slot had none, so it is drafted fresh
            coupled = torch.cat([mrs_out, fresh[:, -1:]], dim=1)
        else:
            if self.gumbel_table is not None:
                g = self.gumbel_table[self.rows[:, None], tpos]
            else:
                g = position_gumbel(self.gkey, self.rows[:, None], tpos, self.V)
            coupled = gumbel_coupling(p, g)
        if alpha < 1.0:
            coin = torch.rand(coupled.shape, generator=self.gen, device=self.dev) < alpha
            coupled = torch.where(coin, coupled, fresh)
        return coupled

    def _stats(self, committed_log, active_log, at_step, nfe, prefill_s, decode_s, forward_s):
        geo, B = self.geo, self.B
        if committed_log:
            committed = torch.stack(committed_log, 1).cpu()  # [B, steps]
            active = torch.stack(active_log, 1).cpu()
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
        peak = torch.cuda.max_memory_allocated(self.dev) if self.dev.type == "cuda" else None
        return GenerationStats(
            backend=self.backend.name, params=self.backend.params(), batch=B,
            image_tokens=n_img, forced_tokens=geo.seq_len - n_img, nfe=nfe, steps=steps,
            step_compression=compression,
            mean_accepted_length=float(lengths.float().mean()) if lengths.numel() else 0.0,
            accepted_length_histogram=hist, prefill_s=prefill_s, decode_s=decode_s,
            latency_s=prefill_s + decode_s, forward_s=forward_s,
            overhead_s=None if forward_s is None else max(decode_s - forward_s, 0.0),
            peak_memory_bytes=peak, accepted_at_step=maps,
        )
