"""Janus / Janus-Pro (DeepSeek) through transformers' `JanusForConditionalGeneration`.

Follows transformers' own image-generation path (`generate(generation_mode="image")`): the prompt, the unconditional
row, the image-code embeddings and head, the VQ decoder as docs/MODELS.md, "Janus-Pro", says.

The KV cache is our `SlotCache` (per-row committed lengths, tree masks; see hf_common).
"""
from __future__ import annotations

import json
import os

import torch

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..family import ModelFamily, Sampling, config_names, read_config, square_size
from ..files.hf_files import load_tokenizer
from .hf_common import HFImageModel, to_pil

# the Janus-Pro format, used when the folder ships no chat template
FALLBACK_TEMPLATE = "<|User|>: {text}\n\n<|Assistant|>:"
SAMPLING = Sampling("Janus-Pro", 5.0, 1000)  # what "model default" guidance uses


def _chat_template(folder: str, tokenizer):
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.chat_template
    p = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(p):
        with open(p, encoding="utf-8") as f:
            return f.read()
    for name in ("chat_template.json", "processor_config.json"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            try:
                with open(p, encoding="utf-8") as f:
                    t = json.load(f).get("chat_template")
            except (OSError, ValueError, AttributeError):
                t = None
            if isinstance(t, str) and t:
                return t
    return None


class JanusImageModel(HFImageModel):
    family = "janus"

    def __init__(self, folder: str, device=None, dtype=None, device_map=None, max_memory=None, offload_folder=None,
                 attn_implementation=None, image_size=None, quantize=None):
        super().__init__()
        from transformers import GenerationConfig, JanusForConditionalGeneration

        read_config(folder)  # a missing or broken config.json is reported here
        self._open_folder(folder, device, dtype, "janus")
        # tokenizer first: a missing file fails before the (slow) weight loading
        self.tokenizer = load_tokenizer(folder)
        mc = self._load_transformers_model(JanusForConditionalGeneration, folder, device_map, max_memory,
                                           offload_folder, attn_implementation, quantize, "model.language_model.layers")
        vq = mc.vq_config
        grid = int(vq.num_patches)
        self.pixel_factor = 2 ** (len(vq.channel_multiplier) - 1)
        self.resolution = grid * self.pixel_factor
        if image_size is not None and image_size != self.resolution:
            raise ValueError(f"image_size={image_size!r}: this Janus checkpoint generates {self.resolution}x"
                             f"{self.resolution} images only ({grid}x{grid} tokens; config.json vision_config "
                             f"image_size / patch_size)")
        n_img = getattr(mc.vision_config, "num_image_tokens", grid * grid)
        if n_img != grid * grid:
            raise ValueError(f"config.json is inconsistent: vision_config.num_image_tokens={n_img} but the VQ grid "
                             f"is {grid}x{grid} (vision_config.image_size // patch_size)")
        V = int(vq.num_embeddings)
        self.geometry = ImageGeometry(height=grid, width=grid, vocab_size=V, row_end=False)
        self.default_sampling = SAMPLING.for_vocab(V)
        self._use_backbone(self.model.model.language_model, mc.text_config)
        # special ids: the generation config (what transformers' generate uses), else the tokenizer
        try:
            gen = GenerationConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError):
            gen = None
        tok = self.tokenizer
        boi_token = getattr(tok, "boi_token", None) or "<begin_of_image>"
        boi = (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id") if gen is not None else None
        self.boi_id = boi if boi is not None else tok.convert_tokens_to_ids(boi_token)
        self.bos_id = getattr(gen, "bos_token_id", None) if gen is not None else None
        self.bos_id = tok.bos_token_id if self.bos_id is None else self.bos_id
        pad = getattr(gen, "pad_token_id", None) if gen is not None else None
        self.pad_id = tok.pad_token_id if pad is None else pad
        for what, v in (("begin-of-image", self.boi_id), ("BOS", self.bos_id), ("pad", self.pad_id)):
            if v is None or (tok.unk_token_id is not None and v == tok.unk_token_id):
                raise ValueError(f"the {what} token is not defined by tokenizer_config.json / generation_config.json "
                                 f"in {folder!r}")
        self.boi_token = tok.convert_ids_to_tokens(self.boi_id)
        self.chat_template = _chat_template(folder, tok)

    # -- prompts ---------------------------------------------------------------------------
    def format_prompt(self, text: str) -> str:
        if self.chat_template:
            messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
            s = self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                   add_generation_prompt=True)
        else:
            s = FALLBACK_TEMPLATE.format(text=text)
        return s + self.boi_token

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        cond = list(self.tokenizer(self.format_prompt(text)).input_ids)
        if negative_text:
            uncond = list(self.tokenizer(self.format_prompt(negative_text)).input_ids)
        else:  # transformers: every prompt token except BOS and begin-of-image becomes the pad token
            uncond = [t if t in (self.bos_id, self.boi_id) else self.pad_id for t in cond]
        return EncodedPrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text)

    # -- model hooks -----------------------------------------------------------------------
    def _draft_embeds(self, tokens):
        return self.model.prepare_embeddings_for_image_generation(tokens)

    def _image_logits(self, hidden):
        return self.model.model.generation_head(hidden)

    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor, chunk: int = 8, prompt=None):
        B = tokens.shape[0]
        dev = self.model.model.vqmodel.quantize.embedding.weight.device
        out = []
        for i in range(0, B, chunk):
            codes = tokens[i:i + chunk].reshape(-1, self.geometry.num_image_tokens).to(dev)
            out.extend(to_pil(self.model.decode_image_tokens(codes)))
        return out


def is_janus(folder: str, config) -> bool:
    model_type, archs = config_names(config)
    if model_type == "multi_modality":
        raise ValueError(f"{os.path.join(folder, 'config.json')}: model_type 'multi_modality': Janus / Janus-Pro in "
                         f"DeepSeek's original format needs trust_remote_code; use the transformers conversion "
                         f"instead (deepseek-community/Janus-Pro-1B or deepseek-community/Janus-Pro-7B)")
    return model_type == "janus" or "JanusForConditionalGeneration" in archs


FAMILY = ModelFamily(
    name=JanusImageModel.family, label="Janus / Janus-Pro", files="transformers format", load=JanusImageModel,
    detect=is_janus, sizes="Janus-Pro 384x384 only", resolutions=("384x384",),
    size_options=square_size("Janus", "at its checkpoint's size; Janus-Pro: 384x384"), sampling=(SAMPLING,),
    transformers=True, quantize=True, offload=True)
