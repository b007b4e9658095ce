"""Emu3 (BAAI, Emu3-Gen) through transformers' `Emu3ForConditionalGeneration`.

Layout of a generation, as Emu3's processor and transformers' generation path build it:

    prompt:  BOS text <|image start|> "{H}*{W}" <|image token|>
    image:   H rows of W visual tokens, each row followed by EOL (<|extra_200|>),
             then EOF (<|extra_201|>), <|image end|>, EOS

Image codes (``<|visual tokenNNNNNN|>`` through ``model.vocabulary_mapping``: engine id c is code c, engine id V is
EOL, a forced structure token), logits, CFG and pixels (``decode_image_tokens``): docs/MODELS.md, "Emu3".

Grid size: ``image_area`` (default 518400 = 720x720 pixels -> 90x90 tokens) and ``ratio``
("W:H", default "1:1"), as in Emu3's processor (8x downsampling).
"""
from __future__ import annotations

import json
import math
import os
import re

import torch

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..family import ModelFamily, Sampling, config_names, read_config
from ..files.hf_files import load_tokenizer
from .hf_common import SharedVocabImageModel, to_pil

DOWNSAMPLE = 8  # Emu3Processor.downsample_ratio
DEFAULT_IMAGE_AREA = 518400
VISUAL = re.compile(r"^<\|visual token(\d{6})\|>$")
SAMPLING = Sampling("Emu3", 3.0, 2048)  # what "model default" guidance uses


def generation_grid(ratio: str, image_area: int, factor: int = DOWNSAMPLE):
    """(height, width) in tokens, exactly as Emu3Processor.calculate_generate_size."""
    if not isinstance(ratio, str) or not re.fullmatch(r"\s*\d+\s*:\s*\d+\s*", ratio) or \
            0 in tuple(map(int, ratio.split(":"))):
        raise ValueError(f"ratio must be 'W:H' with positive integers (e.g. '1:1', '16:9'), got {ratio!r}")
    if isinstance(image_area, bool) or not isinstance(image_area, int) or image_area < factor * factor:
        raise ValueError(f"image_area must be an int >= {factor * factor} (pixels; Emu3-Gen: 518400 = 720x720), "
                         f"got {image_area!r}")
    width, height = map(int, ratio.split(":"))
    target = (image_area / (width * height)) ** 0.5
    h, w = int(round(height * target / factor)), int(round(width * target / factor))
    if h < 1 or w < 1:
        raise ValueError(f"ratio {ratio!r} with image_area {image_area} gives an empty {h}x{w} token grid")
    return h, w


class Emu3ImageModel(SharedVocabImageModel):
    family = "emu3"

    def __init__(self, folder: str, device=None, dtype=None, image_area=None, ratio=None, device_map=None,
                 max_memory=None, offload_folder=None, attn_implementation=None, quantize=None):
        super().__init__()
        from transformers import Emu3ForConditionalGeneration

        cfg = read_config(folder)
        self._open_folder(folder, device, dtype, "emu3")
        # the generation size: options, else processor_config.json, else Emu3-Gen's defaults
        proc_cfg = {}
        p = os.path.join(folder, "processor_config.json")
        if os.path.isfile(p):
            try:
                with open(p, encoding="utf-8") as f:
                    proc_cfg = json.load(f) or {}
            except (OSError, ValueError):
                proc_cfg = {}
        self.image_area = image_area if image_area is not None else proc_cfg.get("image_area", DEFAULT_IMAGE_AREA)
        self.ratio = ratio if ratio is not None else proc_cfg.get("ratio", "1:1")
        H, W = generation_grid(self.ratio, self.image_area)
        vq_cfg = cfg.get("vq_config") or {}
        mult = vq_cfg.get("channel_multiplier", [1, 2, 2, 4])
        if 2 ** (len(mult) - 1) != DOWNSAMPLE:
            raise ValueError(f"{os.path.join(folder, 'config.json')}: vq_config.channel_multiplier {mult} gives "
                             f"{2 ** (len(mult) - 1)}x downsampling; Emu3's processor assumes {DOWNSAMPLE}x")
        max_pos = (cfg.get("text_config") or {}).get("max_position_embeddings")
        if max_pos is not None and H * (W + 1) + 3 > max_pos:
            raise ValueError(f"image_area={self.image_area} with ratio {self.ratio!r} gives a {H}x{W} token grid "
                             f"({H * (W + 1)} tokens with row ends); this model was trained for at most {max_pos} "
                             f"positions (config.json max_position_embeddings): use a smaller image_area "
                             f"(Emu3-Gen: 518400)")
        tok = self.tokenizer = load_tokenizer(folder)
        special = {}
        for attr in ("boi_token", "image_wrapper_token", "eof_token", "eoi_token", "bos_token", "eos_token"):
            v = getattr(tok, attr, None)
            if not v:
                raise ValueError(f"the tokenizer in {folder!r} defines no {attr} (tokenizer_config.json); "
                                 f"Emu3 needs it for its generation layout")
            special[attr] = v
        self.special = special
        mc = self._load_transformers_model(Emu3ForConditionalGeneration, folder, device_map, max_memory, offload_folder,
                                           attn_implementation, quantize, "model.text_model.layers")
        vm = self.model.vocabulary_mapping
        V = int(mc.vq_config.codebook_size)
        codes = {}
        for name, idx in (mc.vocabulary_map or {}).items():
            m = VISUAL.match(name)
            if m:
                codes[int(m.group(1))] = idx
        missing = [c for c in range(V) if c not in codes]
        if missing or len(codes) != V:
            raise ValueError(f"{os.path.join(folder, 'config.json')}: vocabulary_map has {len(codes)} visual tokens "
                             f"but vq_config.codebook_size is {V}")
        if vm.eol_token_id is None:
            raise ValueError(f"{os.path.join(folder, 'config.json')}: vocabulary_map has no <|extra_200|> (row end)")
        tok_vocab = tok.get_vocab()
        for name in ("<|extra_200|>", "<|visual token000000|>"):
            if tok_vocab.get(name) != mc.vocabulary_map.get(name):
                raise ValueError(f"tokenizer.json and config.json vocabulary_map disagree on {name}")
        self.eol_id = int(vm.eol_token_id)
        self.eof_id = tok.convert_tokens_to_ids(special["eof_token"])
        self.eoi_id = tok.convert_tokens_to_ids(special["eoi_token"])
        self.eos_id = tok.convert_tokens_to_ids(special["eos_token"])
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.geometry = ImageGeometry(height=H, width=W, vocab_size=V, row_end=True)
        self.default_sampling = SAMPLING.for_vocab(V)
        self._use_backbone(self.model.model.text_model, mc.text_config)
        self._map_image_codes([codes[c] for c in range(V)], [self.eol_id])  # row end: EOL

    # -- prompts ---------------------------------------------------------------------------
    def format_prompt(self, text: str) -> str:
        H, W = self.geometry.height, self.geometry.width
        s = self.special
        return f"{s['bos_token']}{text}{s['boi_token']}{H}*{W}{s['image_wrapper_token']}"

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        cond = list(self.tokenizer(self.format_prompt(text), add_special_tokens=False).input_ids)
        uncond = list(self.tokenizer(self.format_prompt(negative_text), add_special_tokens=False).input_ids)
        return EncodedPrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text)

    def to_model_ids(self, seq: torch.Tensor) -> torch.Tensor:
        """Engine ids [B, seq_len] -> vocabulary ids, plus EOF, end-of-image, EOS (H*(W+1)+3 tokens)."""
        ids = self._engine_to_model.cpu()[seq.cpu()]
        tail = torch.tensor([self.eof_id, self.eoi_id, self.eos_id]).expand(ids.shape[0], 3)
        return torch.cat([ids, tail], 1)

    # -- model hooks -----------------------------------------------------------------------
    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor, chunk: int = 4, prompt=None):
        B, H, W = tokens.shape
        V = self.geometry.vocab_size
        seq = torch.cat([tokens.reshape(B, H, W), torch.full((B, H, 1), V, dtype=torch.long)], 2).reshape(B, -1)
        ids = self.to_model_ids(seq)
        dev = self.model.model.vqmodel.quantize.embedding.weight.device
        out = []
        for i in range(0, B, chunk):
            pix = self.model.decode_image_tokens(image_tokens=ids[i:i + chunk].to(dev), height=H, width=W)
            out.extend(to_pil(pix.permute(0, 2, 3, 1)))
        return out


# aspect ratios listed for Emu3 (its processor takes any W:H; these are the common ones) at its default area
EMU3_RATIOS = ("1:1", "4:3", "3:4", "3:2", "2:3", "16:9", "9:16", "21:9", "9:21")


def emu3_sizes(image_area: int = DEFAULT_IMAGE_AREA):
    """(width, height) in pixels of Emu3's grid for each of EMU3_RATIOS at `image_area`, as its processor
    computes them (the sizes the loader lists; `size_options` gives each back the same grid)."""
    out = []
    for r in EMU3_RATIOS:
        h, w = generation_grid(r, image_area)
        out.append((w * DOWNSAMPLE, h * DOWNSAMPLE))
    return out


def is_emu3(folder: str, config) -> bool:
    model_type, archs = config_names(config)
    if model_type == "Emu3":
        raise ValueError(f"{os.path.join(folder, 'config.json')}: this is Emu3 in BAAI's original format "
                         f"(trust_remote_code); use the transformers conversion instead (BAAI/Emu3-Gen-hf)")
    return model_type == "emu3" or "Emu3ForConditionalGeneration" in archs


def size_options(folder: str, w: int, h: int) -> dict:
    """Any W x H: ``image_area`` W * H pixels at the ratio W:H (the positions are checked at load)."""
    g = math.gcd(w, h)
    return {"image_area": w * h, "ratio": f"{w // g}:{h // g}"}


FAMILY = ModelFamily(
    name=Emu3ImageModel.family, label="Emu3", files="transformers format", load=Emu3ImageModel, detect=is_emu3,
    sizes="Emu3 any W x H", size_options=size_options, sampling=(SAMPLING,), transformers=True, offload=True,
    resolutions=tuple(f"{w}x{h}" for w, h in emu3_sizes()), quantize=True)
