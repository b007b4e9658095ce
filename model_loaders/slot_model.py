"""`SlotCacheModel`: the one implementation of start / forward / commit over a static per-row
slot cache (layout in `slots.py`), shared by our Llama adapter and the transformers adapters.

A family adapter subclasses it and provides the hooks below; everything the sampling core sees
(prefill with CFG as one batch, chain and tree forwards, per-row trees, commit of a gathered
path, hidden states of both CFG branches for drafters) is implemented here once.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .contract import ARImageModel, EncodedPrompt, ForwardOutput, Session
from .slots import SlotState, cfg_rows, draft_layout, path_moves, prefill_layout, tree_tensors


class SlotCacheModel(ARImageModel):
    """Hooks a subclass implements:

    - ``_new_cache(rows, capacity)``: an empty static KV cache;
    - ``_embed_prompt(ids [R, P])``: embeddings of prompt ids (model vocabulary);
    - ``embed_tokens(tokens [R, T])``: embeddings of engine ids (image codes, structure tokens);
    - ``_run(embeds, positions, allowed [R, T, S] bool, cache, slots [R, T])``: last hidden states
      [R, T, D] after the final norm, writing the new keys / values at ``slots``;
    - ``_gather(cache, rows, dst, src)``: copy cache slots ``src`` to ``dst`` per row;
    - ``image_logits(hidden)``: logits of the image codes only.
    And sets ``geometry``, ``pad_id`` and ``max_positions`` (None: unlimited).
    """

    pad_id: int = 0
    max_positions: Optional[int] = None

    def _trees(self) -> dict:
        memo = self.__dict__.get("_tree_memo")
        if memo is None:
            memo = self.__dict__["_tree_memo"] = {}
        return memo

    def _output(self, h: torch.Tensor, batch: int, cfg: bool) -> ForwardOutput:
        logits = self.image_logits(h).float()
        if cfg:
            return ForwardOutput(cond=logits[:batch], uncond=logits[batch:], hidden=h[:batch], hidden_uncond=h[batch:])
        return ForwardOutput(cond=logits, hidden=h)

    @torch.inference_mode()
    def start(self, prompt: EncodedPrompt, batch: int, cfg: bool, draft_capacity: int) -> Session:
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
            branches, batch, self.geometry.seq_len + draft_capacity + 1, self.pad_id, dev)
        state.cache = self._new_cache(state.rows, state.S)
        h = self._run(self._embed_prompt(tokens), positions, allowed, state.cache, slots)
        return Session(batch=batch, cfg=cfg, committed=torch.zeros(batch, dtype=torch.long, device=dev),
                       first=self._output(h[:, -1:], batch, cfg), state=state)

    @torch.inference_mode()
    def forward(self, session: Session, tokens: torch.Tensor,
                parents: Union[Sequence[int], torch.Tensor]) -> ForwardOutput:
        st: SlotState = session.state
        B, dev = tokens.shape[0], self.device
        depth, anc = tree_tensors(self._trees(), parents, dev, tokens.shape[1])
        if depth.dim() == 2:
            depth, anc = cfg_rows(session.cfg, depth, anc)
        tokens, committed = cfg_rows(session.cfg, tokens.to(dev), session.committed)
        slots, positions, allowed = draft_layout(st, committed, depth, anc)
        h = self._run(self.embed_tokens(tokens), positions, allowed, st.cache, slots)
        return self._output(h, B, session.cfg)

    @torch.inference_mode()
    def commit(self, session: Session, path: Optional[torch.Tensor], length: torch.Tensor) -> None:
        st: SlotState = session.state
        length = length.to(self.device)
        if path is not None:  # gather the accepted nodes to consecutive slots
            rows, dst, src = path_moves(st, *cfg_rows(session.cfg, session.committed, path.to(self.device)))
            self._gather(st.cache, rows, dst, src)
        session.committed = session.committed + length
