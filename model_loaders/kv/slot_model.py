"""`SlotCacheModel`: the one implementation of start / forward / commit over a static per-row
slot cache (the cache in `store.py`, its layout in `slots.py`), shared by every adapter.

A family adapter subclasses it and provides the hooks below; everything the sampling core sees
(prefill with CFG as one batch, chain and tree forwards, per-row trees, commit of a gathered
path, hidden states of both CFG branches for drafters) is implemented here once.
"""
from __future__ import annotations

import os
import weakref
from typing import Optional, Sequence, Union

import torch

from ..capture import inference_mode_unless_traced, mark_static_addresses, reachable_tensors, uses_graph_buffers
from ..contract import ARImageModel, EncodedPrompt, ForwardOutput, Session
from ..devices import resolve_device, resolve_dtype
from .slots import SlotState, cfg_rows, draft_layout, path_moves, prefill_layout, tree_tensors

CAPTURED_PROMPT_MULTIPLE = 64  # captured sessions round the prompt slots up: one graph per 64 prompt tokens


class SlotCacheModel(ARImageModel):
    """Hooks a subclass implements:

    - ``_new_cache(rows, capacity)``: an empty static KV cache (store.py), and ``_gather(cache, rows, dst,
      src)`` where the cache has no ``gather(rows, dst, src)`` of its own (copy slots ``src`` to ``dst`` per row);
    - ``_embed_prompt(ids [R, P])``: embeddings of prompt ids (model vocabulary);
    - ``embed_tokens(tokens [R, T])``: embeddings of engine ids (image codes, structure tokens);
    - ``_run(embeds, positions, allowed [R, T, S] bool, cache, slots [R, T])``: last hidden states
      [R, T, D] after the final norm, writing the new keys / values at ``slots``;
    - ``image_logits(hidden)``: logits of the image codes only.
    And sets ``geometry``, ``pad_id`` and ``max_positions`` (None: unlimited).
    """

    pad_id: int = 0
    max_positions: Optional[int] = None
    capturable = True  # forward and commit are pure tensor code

    def _open_folder(self, folder: str, device, dtype, default_name: str) -> None:
        """What an adapter loaded from a folder keeps first: the folder, its name (the folder's), the device and
        the dtype (devices.py)."""
        self.folder = folder
        self.name = os.path.basename(os.path.normpath(folder)) or default_name
        self._device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self._device)

    @property
    def device(self) -> torch.device:
        return self._device

    def _output(self, h: torch.Tensor, batch: int, cfg: bool) -> ForwardOutput:
        logits = self.image_logits(h).float()
        if cfg:
            return ForwardOutput(cond=logits[:batch], uncond=logits[batch:], hidden=h[:batch], hidden_uncond=h[batch:])
        return ForwardOutput(cond=logits, hidden=h)

    @torch.inference_mode()
    def start(self, prompt: EncodedPrompt, batch: int, cfg: bool, draft_capacity: int,
              captured: bool = False) -> Session:
        prompt = self.check_prompt(prompt)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        dev = self.device
        branches = [list(prompt.cond)] + ([list(prompt.uncond)] if cfg else [])
        P = max(len(s) for s in branches)
        need = self.positions_needed(P, draft_capacity)
        if self.max_positions is not None and need > self.max_positions:
            raise ValueError(f"a prompt of {P} tokens plus a {self.geometry.seq_len}-token image and "
                             f"{draft_capacity + 1} draft slots needs {need} positions; this model has "
                             f"{self.max_positions}")
        tokens, positions, allowed, slots, state = prefill_layout(
            branches, batch, self.geometry.seq_len + draft_capacity + 1, self.pad_id, dev,
            prompt_multiple=CAPTURED_PROMPT_MULTIPLE if captured else 1)
        state.cache = self._session_cache(state, reuse=captured and uses_graph_buffers(dev))
        if captured:  # CUDA graphs need the cache's address static (capture.mark_static_addresses)
            mark_static_addresses(reachable_tensors(state.cache).values(), dev)
        h = self._run(self._embed_prompt(tokens), positions, allowed, state.cache, slots)
        return Session(batch=batch, cfg=cfg, committed=torch.zeros(batch, dtype=torch.long, device=dev),
                       first=self._output(h[:, -1:], batch, cfg), state=state)

    def _session_cache(self, state: SlotState, reuse: bool):
        """The session's KV cache: `_new_cache`; or, for a captured session whose graphs are CUDA graphs (`reuse`),
        the model's cache of the last such session, zeroed, when it has this session's shape and no live session
        uses it. Then the cache keeps its addresses from one generation to the next (the graphs replay without
        recording again: samplers/compiled_step/graph_buffers.py) and the model never holds two (a 7B model's is
        gigabytes). Caches whose kind `reset_cache` does not know (transformers' `SlotCache`) are made anew each
        time."""
        key = (state.rows, state.S)
        pooled = self.__dict__.pop("_graph_cache", None)  # (key, cache, weak reference to the session state using it)
        if pooled is not None and pooled[2]() is not None:  # a live session uses it: it stays that session's
            pooled = None
        if reuse and pooled is not None and pooled[0] == key:
            cache = pooled[1]
            reset_cache(cache)
        else:
            pooled = None  # (let go before allocating: never two caches held at once)
            cache = self._new_cache(state.rows, state.S)
        if reuse and resettable_cache(cache):
            self.__dict__["_graph_cache"] = (key, cache, weakref.ref(state))
        return cache

    @inference_mode_unless_traced
    def forward(self, session: Session, tokens: torch.Tensor,
                parents: Union[Sequence[int], torch.Tensor]) -> ForwardOutput:
        """The draft tree's mask and positions after each row's committed prefix, the decoder with its cache
        writes, and the image logits (float32) with the last hidden states. Pure tensor code (a caller's
        compiled step captures it): with per-row trees the mask is built on the device."""
        st: SlotState = session.state
        B, T = tokens.shape
        cfg = session.cfg
        # inside a caller's compiled step a shared tree's tensors are made in its graph (constants): a memo of
        # tensors made eagerly (inference tensors) cannot be a graph's constant
        memo = {} if torch.compiler.is_compiling() else self.__dict__.setdefault("_tree_memo", {})
        depth, anc = tree_tensors(memo, parents, self.device, T)
        if depth.dim() == 2:  # one tree per row: the unconditional rows take their image's
            depth, anc = cfg_rows(cfg, depth, anc)
        tokens, committed = cfg_rows(cfg, tokens.to(self.device), session.committed)
        slots, positions, allowed = draft_layout(st.P, st.S, st.valid, st.pos0, committed, depth, anc)
        h = self._run(self.embed_tokens(tokens), positions, allowed, st.cache, slots)
        return self._output(h, B, cfg)

    @inference_mode_unless_traced
    def commit(self, session: Session, path: Optional[torch.Tensor], length: torch.Tensor) -> None:
        st: SlotState = session.state
        length = length.to(self.device)
        if path is not None:  # gather the accepted nodes to consecutive slots
            rows, dst, src = path_moves(st, *cfg_rows(session.cfg, session.committed, path.to(self.device)))
            self._gather(st.cache, rows, dst, src)
        session.committed = session.committed + length

    def _gather(self, cache, rows, dst, src):
        cache.gather(rows, dst, src)


def resettable_cache(cache) -> bool:
    """Whether `reset_cache` can bring `cache` back to what `_new_cache` makes: (layers of) tensors only, or a
    cache class that says so (`reusable_for_sessions`, as `store.SlotKV`; not transformers' `Cache`, whose
    `reset` knows nothing of our slots)."""
    if getattr(cache, "reusable_for_sessions", False):
        return True
    return isinstance(cache, (list, tuple)) and all(
        isinstance(layer, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in layer) for layer in cache)


def reset_cache(cache) -> None:
    """Zero a cache for a new session, as `_new_cache` makes it (every slot a new session reads is written by
    its prefill or masked; zeros keep a masked slot from carrying a NaN of an earlier session into 0 * NaN),
    and let it forget the rest of the last session (`forget_session`, where it has one)."""
    for t in reachable_tensors(cache).values():
        t.zero_()
    forget = getattr(cache, "forget_session", None)
    if forget is not None:
        forget()
