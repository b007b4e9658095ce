"""Chameleon-family image generators through transformers' `ChameleonForConditionalGeneration`:
Lumina-mGPT (Alpha-VLLM) and Anole (GAIR), two layouts of one adapter.

Image codes, logits, the two layouts (``layout`` option) and the pixel decoder: docs/MODELS.md, "Lumina-mGPT and
Anole in detail".
"""
from __future__ import annotations

import os
import re

import torch

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..family import ModelFamily, Sampling, config_names, read_config
from ..files.hf_files import load_tokenizer
from .chameleon_vqgan import load_vqgan_decoder
from .hf_common import SharedVocabImageModel, to_pil

LAYOUTS = ("lumina", "anole")
IMAGE_START, IMAGE_END = "<racm3:break>", "<eoss>"
LUMINA_SEP, LUMINA_NEWLINE = "<reserved08706>", "<reserved08799>"
LUMINA_PATCH = 32  # pixels per size-token unit (2x2 codes)
LUMINA_PROMPT = "Generate an image of {w}x{h} according to the following prompt:\n{text}"
IMG_NAME = re.compile(r"^IMGIMG([A-J]+)Z$")
LUMINA_ARCH = "ChameleonXLLMXForConditionalGeneration"
LUMINA_TARGETS = (512, 768, 1024)  # the target sizes Lumina-mGPT's checkpoints are trained for
# Lumina-mGPT's recommended settings (its demo: CFG 3, image top-k 2000); Chameleon's own
# inference guides images with CFG 3 and samples at temperature 0.7, top-p 0.9 (Anole's "model default")
SAMPLING = {"lumina": Sampling("Lumina-mGPT", 3.0, 2000),
            "anole": Sampling("Anole", 3.0, None, temperature=0.7, top_p=0.9)}


def code_token_name(code: int) -> str:
    """Vocabulary name of image code `code` (digits written as letters A..J)."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def lumina_sizes(target_size: int):
    """(width, height) pixel sizes Lumina-mGPT offers for `target_size` (its generate_crop_size_list:
    (target/32)^2 patches of 32 px, aspect ratio at most 4), widest first."""
    n = (target_size // LUMINA_PATCH) ** 2
    sizes, wp, hp = [], n, 1
    while wp > 0:
        if max(wp, hp) / min(wp, hp) <= 4.0:
            sizes.append((wp * LUMINA_PATCH, hp * LUMINA_PATCH))
        if (hp + 1) * wp <= n:
            hp += 1
        else:
            wp -= 1
    return sizes


def lumina_grid(model, label: str, resolution, target_size: int, f: int, vocab: dict) -> tuple:
    """The code grid (H, W) of a Lumina layout at `resolution` ("WxH"; None: the `target_size` square) for an
    image tokenizer downsampling `f`x; sets ``model.resolution`` (w, h) and ``model.size_ids`` (the size
    tokens, height first). ValueError naming the sizes `label` offers, or the missing token."""
    sizes = lumina_sizes(target_size)
    if resolution is None:
        resolution = f"{target_size}x{target_size}"
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", resolution) if isinstance(resolution, str) else None
    if m is None or (int(m.group(1)), int(m.group(2))) not in sizes:
        raise ValueError(f"resolution {resolution!r} is not a {label} size for target_size {target_size}; "
                         f"allowed (WxH): {', '.join(f'{w}x{h}' for w, h in sizes)}")
    w, h = int(m.group(1)), int(m.group(2))
    if LUMINA_PATCH % f:
        raise ValueError(f"the image tokenizer downsamples {f}x; {label}'s 32-pixel size tokens need a divisor of 32")
    names = [lumina_size_token(h // LUMINA_PATCH), lumina_size_token(w // LUMINA_PATCH)]
    for n in names:
        if n not in vocab:
            raise ValueError(f"the tokenizer in {model.folder!r} has no size token {n} for {resolution}")
    model.resolution, model.size_ids = (w, h), [vocab[n] for n in names]
    return h // f, w // f


def lumina_size_token(n: int) -> str:
    return f"<reserved{8800 + n:05d}>"


class ChameleonImageModel(SharedVocabImageModel):
    family = "chameleon"

    def __init__(self, folder: str, device=None, dtype=None, layout=None, resolution=None, target_size=None,
                 device_map=None, max_memory=None, offload_folder=None, attn_implementation=None, quantize=None):
        super().__init__()
        from transformers import ChameleonForConditionalGeneration

        cfg = read_config(folder)
        cfg_path = os.path.join(folder, "config.json")
        self._open_folder(folder, device, dtype, "chameleon")
        if layout is None:
            layout = "lumina" if is_lumina(cfg) else "anole"
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)} (Lumina-mGPT or Anole / Chameleon), "
                             f"got {layout!r}")
        self.layout = layout
        tok = self.tokenizer = load_tokenizer(folder)
        vocab = tok.get_vocab()
        self.vqgan = load_vqgan_decoder(folder, device=self._device)  # before the (slow) language model
        f = self.pixel_factor = self.vqgan.downsample
        V = int(self.vqgan.quantize.embedding.weight.shape[0])
        vmap = cfg.get("vocabulary_map") or vocab
        codes = {}
        for name, idx in vmap.items():
            m = IMG_NAME.match(name)
            if m:
                codes[int("".join(str(ord(c) - ord("A")) for c in m.group(1)))] = int(idx)
        if sorted(codes) != list(range(V)):
            raise ValueError(f"{cfg_path}: vocabulary_map has {len(codes)} image tokens (IMGIMG...Z) but the image "
                             f"tokenizer's codebook (vqgan.yaml n_embed) has {V}")
        for name in (IMAGE_START, IMAGE_END) + ((LUMINA_SEP, LUMINA_NEWLINE) if layout == "lumina" else ()):
            if name not in vocab:
                raise ValueError(f"the tokenizer in {folder!r} has no {name} token, which the {layout} layout needs")
        self.boi_id, self.eoi_id = vocab[IMAGE_START], vocab[IMAGE_END]
        self.bos_id = tok.bos_token_id
        if self.bos_id is None:
            raise ValueError(f"the tokenizer in {folder!r} defines no BOS token (tokenizer_config.json bos_token)")
        H, W = self._grid(layout, resolution, target_size, cfg, f, vocab)
        mc = self._load_transformers_model(ChameleonForConditionalGeneration, folder, device_map, max_memory,
                                           offload_folder, attn_implementation, quantize,
                                           allow_missing=("model.vqmodel.",))
        self.vqgan.to(self._device)
        self.max_positions = getattr(mc, "max_position_embeddings", None)
        seq = H * (W + int(layout == "lumina"))
        if self.max_positions is not None and seq + 8 > self.max_positions:
            raise ValueError(f"a {W * f}x{H * f} image is {seq} tokens; this model was trained for at most "
                             f"{self.max_positions} positions (config.json max_position_embeddings)")
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.geometry = ImageGeometry(height=H, width=W, vocab_size=V, row_end=layout == "lumina")
        self.default_sampling = SAMPLING[layout].for_vocab(V)
        self.backbone = self.model.model
        self._num_layers = mc.num_hidden_layers
        self._embed = self.model.get_input_embeddings()
        self._map_image_codes([codes[c] for c in range(V)], [vocab[LUMINA_NEWLINE]] if layout == "lumina" else [])

    def _grid(self, layout, resolution, target_size, cfg, f, vocab):
        if layout == "anole":
            if resolution is not None or target_size is not None:
                raise ValueError("the anole layout generates at the image tokenizer's resolution only "
                                 "(vqgan.yaml ddconfig.resolution); resolution / target_size are Lumina-mGPT options")
            n = (cfg.get("vq_config") or {}).get("resolution", 512) // f
            self.size_ids = []
            return n, n
        if target_size is None:
            m = re.search(r"(512|768|1024)", self.name)
            target_size = int(m.group(1)) if m else 768
        if isinstance(target_size, bool) or not isinstance(target_size, int) or target_size < LUMINA_PATCH:
            raise ValueError(f"target_size must be an int >= {LUMINA_PATCH} (Lumina-mGPT: 512, 768 or 1024), "
                             f"got {target_size!r}")
        return lumina_grid(self, "Lumina-mGPT", resolution, target_size, f, vocab)

    # -- prompts ---------------------------------------------------------------------------
    def _text_ids(self, text: str) -> list:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def format_prompt(self, text: str) -> str:
        if self.layout == "lumina":
            w, h = self.resolution
            return LUMINA_PROMPT.format(w=w, h=h, text=text)
        return text

    def _ids(self, text: str) -> list:
        ids = [self.bos_id] + self._text_ids(self.format_prompt(text))
        if self.layout == "lumina":
            ids.append(self.tokenizer.convert_tokens_to_ids(LUMINA_SEP))
        return ids + [self.boi_id] + self.size_ids

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        if negative_text:
            uncond = self._ids(negative_text)
        elif self.layout == "lumina":
            uncond = [self.boi_id] + self.size_ids
        else:
            uncond = [self.bos_id, self.boi_id]
        return EncodedPrompt(cond=self._ids(text), uncond=uncond, text=text, negative_text=negative_text)

    def to_model_ids(self, seq: torch.Tensor) -> torch.Tensor:
        """Engine ids [B, seq_len] -> vocabulary ids followed by end-of-image."""
        ids = self._engine_to_model.cpu()[seq.cpu()]
        return torch.cat([ids, torch.full((ids.shape[0], 1), self.eoi_id)], 1)

    # -- model hooks -----------------------------------------------------------------------
    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor, chunk: int = 4, prompt=None):
        dev = self.vqgan.post_quant_conv.weight.device
        out = []
        for i in range(0, tokens.shape[0], chunk):
            pix = self.vqgan(tokens[i:i + chunk].to(dev))
            out.extend(to_pil(pix.permute(0, 2, 3, 1)))
        return out


def is_lumina(config: dict) -> bool:
    """Lumina-mGPT's config.json names its own architecture; anything else in the family is Anole."""
    return LUMINA_ARCH in config_names(config)[1]


def is_chameleon(folder: str, config) -> bool:
    model_type, archs = config_names(config)
    return model_type == "chameleon" or bool({"ChameleonForConditionalGeneration", LUMINA_ARCH} & set(archs))


def size_options(folder: str, w: int, h: int) -> dict:
    """Lumina-mGPT: a size its crop list offers for one of its target sizes; Anole: its tokenizer's 512x512."""
    if not is_lumina(read_config(folder)):
        raise ValueError(f"Anole generates 512x512 only (its image tokenizer's resolution); got resolution "
                         f"'{w}x{h}': choose 'model default' or 512x512")
    for target in LUMINA_TARGETS:
        if (w, h) in lumina_sizes(target):
            return {"resolution": f"{w}x{h}", "target_size": target}
    offered = sorted({f"{a}x{b}" for t in LUMINA_TARGETS for a, b in lumina_sizes(t)})  # all in the loader's list
    raise ValueError(f"Lumina-mGPT does not offer {w}x{h}: of the sizes listed, it offers {', '.join(offered)}")


FAMILY = ModelFamily(
    name=ChameleonImageModel.family, label="Lumina-mGPT / Anole", files="transformers format",
    load=ChameleonImageModel, detect=is_chameleon, sizes="Lumina-mGPT its 512 / 768 / 1024 sizes; Anole 512x512",
    size_options=size_options, sampling=tuple(SAMPLING.values()), transformers=True, offload=True,
    resolutions=tuple(dict.fromkeys(["512x512"] + [f"{w}x{h}" for t in LUMINA_TARGETS for w, h in lumina_sizes(t)])), quantize=True)
