"""The adapter base over transformers models (Janus-Pro, Emu3, Chameleon, GLM-Image): `HFImageModel`, the family's
own decoder stack driven directly with `SlotCache` (kv/transformers_cache.py), a FLOAT additive 4D mask
``(R, 1, T, S)`` in the model dtype (0 = attend, ``finfo.min`` = blocked; transformers passes a 4D mask through
unchanged) and explicit ``position_ids`` in the slot layout of every adapter (kv/slots.py); docs/MODELS.md, "One
object per family". Loading the checkpoint safely is files/hf_files.py's job; the device and dtype, devices.py's.
"""
from __future__ import annotations

import functools
import inspect

import torch

from ..files.hf_files import load_pretrained
from ..kv.slot_model import SlotCacheModel


def to_pil(images: torch.Tensor):
    """[B, H, W, 3] in [-1, 1] -> list of PIL images."""
    from PIL import Image

    x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(a) for a in x]


def decode_in_chunks(vq, tokens: torch.Tensor, device, chunk: int) -> list:
    """PIL images of code grids [B, H, W] through a VQ decoder giving [b, 3, H', W'] in [-1, 1], `chunk`
    grids at a time (the decoder's activations at full resolution bound the batch)."""
    out = []
    for i in range(0, tokens.shape[0], chunk):
        out.extend(to_pil(vq(tokens[i:i + chunk].to(device)).permute(0, 2, 3, 1)))
    return out


class HFImageModel(SlotCacheModel):
    """`SlotCacheModel` over a transformers decoder stack.

    Subclasses set ``self.model`` (the transformers model), ``self.backbone`` (the decoder stack:
    takes inputs_embeds, attention_mask, position_ids, past_key_values), ``self.geometry``,
    ``self._num_layers``, ``max_positions`` and implement ``_draft_embeds(engine ids [R, T])`` and
    ``_image_logits(hidden [R, T, D]) -> [R, T, V]`` (image codes only); ``_prompt_embeds(ids [R, P])`` is the
    model's input embeddings unless a subclass says otherwise.
    """

    backbone: torch.nn.Module

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def hidden_size(self) -> int:
        return int(self._embed.weight.shape[1])

    def torch_module(self):
        return self.model

    def _load_transformers_model(self, cls, folder: str, device_map=None, max_memory=None, offload_folder=None,
                                 attn_implementation=None, quantize=None, layers="model.layers", allow_missing=()):
        """`load_pretrained` into ``self.model`` (with accelerate's device_map, the input embeddings'
        device becomes the model's device; the decoder `layers` are what may be offloaded); returns its config."""
        self.model = load_pretrained(cls, folder, self._device, self._dtype, device_map=device_map,
                                     max_memory=max_memory, offload_folder=offload_folder, layers=layers,
                                     attn_implementation=attn_implementation, quantize=quantize,
                                     allow_missing=allow_missing)
        if device_map is not None:
            self._device = self.model.get_input_embeddings().weight.device
        return self.model.config

    def _use_backbone(self, backbone, text_config) -> None:
        """The decoder stack the slot cache drives, and what the text config says about it."""
        self.backbone = backbone
        self._num_layers = text_config.num_hidden_layers
        self.max_positions = getattr(text_config, "max_position_embeddings", None)
        self._embed = self.model.get_input_embeddings()

    # family hooks ------------------------------------------------------------------------------
    def _prompt_embeds(self, ids: torch.Tensor) -> torch.Tensor:
        return self._embed(ids.to(self._embed.weight.device))

    def _draft_embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # SlotCacheModel hooks ----------------------------------------------------------------------
    def _new_cache(self, rows: int, capacity: int):
        from ..kv.transformers_cache import SlotCache  # imports transformers: only once a model of these families runs

        return SlotCache(self._num_layers, capacity)  # each layer allocated at its first write

    def _embed_prompt(self, ids):
        return self._prompt_embeds(ids)

    def embed_tokens(self, tokens):
        return self._draft_embeds(tokens)

    def image_logits(self, hidden):
        return self._image_logits(hidden)

    def _run(self, embeds, positions, allowed, cache, slots):
        """One pass of the decoder stack; `allowed` [R, T, S] bool -> float additive mask."""
        mask = torch.zeros(allowed.shape, dtype=embeds.dtype, device=embeds.device)
        mask.masked_fill_(~allowed, torch.finfo(embeds.dtype).min)
        cache.set_slots(slots)
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask[:, None], position_ids=positions,
                            use_cache=True, **{_cache_keyword(type(self.backbone)): cache})
        return out.last_hidden_state


@functools.lru_cache(maxsize=None)
def _cache_keyword(backbone_class) -> str:
    """transformers 5.x names the forward's cache `cache` (`past_key_values` warns and goes in 5.40); 4.x has only
    `past_key_values`."""
    return "cache" if "cache" in inspect.signature(backbone_class.forward).parameters else "past_key_values"


class SharedVocabImageModel(HFImageModel):
    """A family whose image codes are rows of the text vocabulary (Emu3, Chameleon): engine code c
    is vocabulary id `_img_ids[c]`, the structure tokens (row ends) follow the V codes, and the
    image head is the LM head restricted to the code rows."""

    def _map_image_codes(self, img_ids: list, structure_ids: list) -> None:
        dev = self._embed.weight.device
        self._img_ids = torch.tensor(img_ids, dtype=torch.long)
        # engine id -> vocabulary id: the V codes, then the structure tokens
        self._engine_to_model = torch.cat([self._img_ids, torch.tensor(structure_ids, dtype=torch.long)]).to(dev)
        head = self.model.lm_head.weight
        self._head_rows = head.detach().index_select(0, self._img_ids.to(head.device)).contiguous()

    def _draft_embeds(self, tokens):
        return self._embed(self._engine_to_model[tokens.to(self._engine_to_model.device)])

    def _image_logits(self, hidden):
        return hidden.to(self._head_rows.device) @ self._head_rows.T

