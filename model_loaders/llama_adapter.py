"""ARImageModel over our own `LlamaDecoder` (tiny test models and the demo model).

Vocabulary of these models: ``[pad, bos, boi, row_end, image codes..., text bytes...]``.
The KV cache is static: row r keeps its left-padded prompt in slots ``0..P-1`` and sequence
position j at slot ``P + j``; draft node i of a forward goes to slot ``P + committed + i``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .contract import ARImageModel, EncodedPrompt, ForwardOutput, ImageGeometry, Session
from .llama import LlamaDecoder
from .slots import cfg_rows, draft_layout, path_moves, prefill_layout, tree_tensors

PAD, BOS, BOI, ROW_END = 0, 1, 2, 3
IMAGE_OFFSET = 4


def byte_text_encoder(vocab_offset: int) -> Callable[[str], list]:
    """Text -> ids: one id per UTF-8 byte, placed after the image codes."""

    def encode(text: str) -> list:
        return [vocab_offset + b for b in text.encode("utf-8")]

    return encode


class LlamaImageModel(ARImageModel):
    def __init__(self, decoder: LlamaDecoder, geometry: ImageGeometry, encode_text: Callable[[str], list],
                 max_prompt_tokens: int = 256, name: str = "llama", decoder_fn: Optional[Callable] = None):
        self.decoder = decoder.eval()
        self.geometry = geometry
        self.encode_text = encode_text
        self.max_prompt_tokens = max_prompt_tokens
        self.name = name
        self._decode = decoder_fn
        V = geometry.vocab_size
        # engine id -> model id: image codes, then the row-end structure token
        self._engine_to_model = torch.cat([torch.arange(V) + IMAGE_OFFSET, torch.tensor([ROW_END])])
        self._image_rows = slice(IMAGE_OFFSET, IMAGE_OFFSET + V)
        self._trees = {}  # parents tuple -> (depth, ancestry) on device

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.weight.device

    # -- prompts ---------------------------------------------------------------------------
    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        for name, value in (("prompt", text), ("negative_prompt", negative_text)):
            if not isinstance(value, str):
                raise ValueError(f"{name} must be a str, got {type(value).__name__}")
        cond = [BOS] + self.encode_text(text) + [BOI]
        uncond = [BOS] + self.encode_text(negative_text) + [BOI]
        for name, ids in (("prompt", cond), ("negative_prompt", uncond)):
            if len(ids) > self.max_prompt_tokens:
                raise ValueError(f"{name} is {len(ids)} tokens long; this model allows at most {self.max_prompt_tokens}")
        return EncodedPrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text)

    # -- session ---------------------------------------------------------------------------
    @torch.inference_mode()
    def start(self, prompt: EncodedPrompt, batch: int, cfg: bool, draft_capacity: int) -> Session:
        prompt = self.check_prompt(prompt)
        dev = self.device
        branches = [prompt.cond] + ([prompt.uncond] if cfg else [])
        limit = self.decoder.cfg.max_positions
        longest = max(len(x) for x in branches) + self.geometry.seq_len + draft_capacity + 1
        if longest > limit:
            raise ValueError(f"prompt of {longest - self.geometry.seq_len - draft_capacity - 1} tokens plus a "
                             f"{self.geometry.seq_len}-token image exceeds the model's {limit} positions")
        # rows: batch copies of the conditional branch, then batch copies of the unconditional one
        tokens, positions, mask, slots, state = prefill_layout(
            branches, batch, self.geometry.seq_len + draft_capacity + 1, PAD, dev)
        R, S = state["rows"], state["S"]
        cache = self.decoder.new_cache(R, S)
        h = self.decoder.hidden_states(tokens, positions, mask, cache, slots)
        state["cache"] = cache
        session = Session(batch=batch, cfg=cfg, committed=torch.zeros(batch, dtype=torch.long, device=dev),
                          first=self._output(h[:, -1:], batch, cfg), state=state)
        return session

    def _output(self, h, batch, cfg) -> ForwardOutput:
        w = self.decoder.lm_head.weight[self._image_rows]  # logits for image rows only
        logits = (h @ w.T).float()
        if cfg:
            return ForwardOutput(cond=logits[:batch], uncond=logits[batch:], hidden=h[:batch])
        return ForwardOutput(cond=logits, hidden=h)

    @torch.inference_mode()
    def forward(self, session: Session, tokens: torch.Tensor, parents: Sequence[int]) -> ForwardOutput:
        st, B, dev = session.state, tokens.shape[0], self.device
        depth, anc = tree_tensors(self._trees, parents, dev, tokens.shape[1])
        if self._engine_to_model.device != dev:  # once per device: no host-to-device copy per step
            self._engine_to_model = self._engine_to_model.to(dev)
        ids, committed = cfg_rows(session.cfg, self._engine_to_model[tokens], session.committed)
        slots, positions, mask = draft_layout(st, committed, depth, anc)
        h = self.decoder.hidden_states(ids, positions, mask, st["cache"], slots)
        return self._output(h, B, session.cfg)

    @torch.inference_mode()
    def commit(self, session: Session, path: Optional[torch.Tensor], length: torch.Tensor) -> None:
        st = session.state
        if path is not None:  # gather the accepted nodes to consecutive slots
            rows, dst, src = path_moves(st, *cfg_rows(session.cfg, session.committed, path))
            for layer in st["cache"]:
                for c in layer:  # [R, H, S, hd] viewed as [R, S, H, hd]
                    c = c.permute(0, 2, 1, 3)
                    c[rows, dst] = c[rows, src]
        session.committed = session.committed + length

    def decode_tokens(self, tokens: torch.Tensor):
        return None if self._decode is None else self._decode(tokens)
