"""ARImageModel over our own `LlamaDecoder` (tiny test models and the demo model).

Vocabulary of these models: ``[pad, bos, boi, row_end, image codes..., text bytes...]``.
The static cache and slot layout are `SlotCacheModel`'s (see kv/slots.py).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..kv.slot_model import SlotCacheModel
from ..kv.store import gather_slots
from ..llama_decoder import LlamaDecoder

PAD, BOS, BOI, ROW_END = 0, 1, 2, 3
IMAGE_OFFSET = 4


def byte_text_encoder(vocab_offset: int) -> Callable[[str], list]:
    """Text -> ids: one id per UTF-8 byte, placed after the image codes."""

    def encode(text: str) -> list:
        return [vocab_offset + b for b in text.encode("utf-8")]

    return encode


class LlamaImageModel(SlotCacheModel):
    pad_id = PAD

    def __init__(self, decoder: LlamaDecoder, geometry: ImageGeometry, encode_text: Callable[[str], list],
                 max_prompt_tokens: int = 256, name: str = "llama", decoder_fn: Optional[Callable] = None):
        self.decoder = decoder.eval()
        self.geometry = geometry
        self.encode_text = encode_text
        self.max_prompt_tokens = max_prompt_tokens
        self.name = name
        self.max_positions = decoder.cfg.max_positions
        self._decode = decoder_fn
        V = geometry.vocab_size
        # engine id -> model id: image codes, then the row-end structure token
        self._engine_to_model = torch.cat([torch.arange(V) + IMAGE_OFFSET, torch.tensor([ROW_END])])
        self._image_rows = slice(IMAGE_OFFSET, IMAGE_OFFSET + V)

    @property
    def device(self) -> torch.device:
        return self.decoder.embed.weight.device

    @property
    def hidden_size(self) -> int:
        return self.decoder.cfg.hidden_size

    def torch_module(self):
        return self.decoder

    # -- prompts ---------------------------------------------------------------------------
    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        cond = [BOS] + self.encode_text(text) + [BOI]
        uncond = [BOS] + self.encode_text(negative_text) + [BOI]
        for name, ids in (("prompt", cond), ("negative_prompt", uncond)):
            if len(ids) > self.max_prompt_tokens:
                raise ValueError(f"{name} is {len(ids)} tokens long; this model allows at most {self.max_prompt_tokens}")
        return EncodedPrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text)

    # -- SlotCacheModel hooks ----------------------------------------------------------------
    def _new_cache(self, rows: int, capacity: int):
        return self.decoder.new_cache(rows, capacity)

    def _embed_prompt(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed(ids)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self._engine_to_model.device != tokens.device:  # once per device: no copy per step
            self._engine_to_model = self._engine_to_model.to(tokens.device)
        return self.decoder.embed(self._engine_to_model[tokens])

    def _run(self, embeds, positions, allowed, cache, slots):
        return self.decoder.hidden_states(None, positions, allowed, cache, slots, embeds=embeds)

    def _gather(self, cache, rows, dst, src):
        gather_slots(cache, rows, dst, src)

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.decoder.lm_head.weight[self._image_rows]  # logits for image rows only
        return hidden @ w.T

    def decode_tokens(self, tokens: torch.Tensor, prompt=None):
        return None if self._decode is None else self._decode(tokens)
