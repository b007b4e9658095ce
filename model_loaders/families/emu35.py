"""Emu3.5 and Emu3.5-Image (BAAI, 34B): our own implementation over the shared slot cache, loading the released
folders (``BAAI/Emu3.5`` / ``BAAI/Emu3.5-Image``: config.json, ``model-0000N-of-00015.safetensors`` +
``model.safetensors.index.json``, ``emu3.tiktoken``, ``emu3_vision_tokens.txt``; ``BAAI/Emu3.5-VisionTokenizer``:
``config.yaml``, ``model.ckpt``) without their remote code. The decoder (the reference's ``Emu3ForCausalLM``) is
Lumina-mGPT 2.0's (lumina2.py, the same tensor names) with Qwen3's per-head q / k RMS norm and an explicit head_dim;
that, the text tokenizer, the prompt and row layout, the guidance and the pixels (the IBQ decoder,
chameleon_vqgan.py): docs/MODELS.md, "Emu3.5 / Emu3.5-Image".
"""
from __future__ import annotations

import base64
import os
import unicodedata

import torch

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..family import ModelFamily, Sampling, config_names, read_config
from ..files.checkpoints import load_into, load_state_dict, read_json_object
from ..files.hf_files import require_file
from ..llama_decoder import RMSNorm
from .chameleon_vqgan import VQGANDecoder, read_vqgan_config
from .lumina2 import Lumina2Config, Lumina2ImageModel

TEMPLATE = "<|extra_203|>You are a helpful assistant for t2i task. USER: {} ASSISTANT: <|extra_100|>"
UNCOND = "<|extra_203|>You are a helpful assistant. USER:  ASSISTANT: <|extra_100|>"
IMAGE_TOKENS = ("<|image token|>", "<|image start|>", "<|image end|>")  # emu3_vision_tokens.txt's first lines
ROW_END = "<|extra_200|>"
PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")  # Qwen's pattern, the reference's PAT_STR
VISION_FOLDERS = ("vision_tokenizer", "Emu3.5-VisionTokenizer")  # inside the model folder, or beside it
VQ_WEIGHTS = ("model.safetensors", "model.ckpt")
# the reference's t2i config: image top-k 5120, temperature 1, top-p 1; guidance 5 for Emu3.5-Image, 2 for Emu3.5
SAMPLING = {"image": Sampling("Emu3.5-Image", 5.0, 5120), "base": Sampling("Emu3.5", 2.0, 5120)}
# its aspect ratios at image_area 1048576: W:H -> (rows, codes per row), 16 px per code
ASPECTS = {"1:1": (64, 64), "4:3": (55, 73), "3:4": (73, 55), "3:2": (52, 78), "2:3": (78, 52), "16:9": (47, 85),
           "9:16": (85, 47), "21:9": (41, 97)}
SIZES = tuple(f"{w * 16}x{h * 16}" for h, w in ASPECTS.values())


class Emu35Config(Lumina2Config):
    def __init__(self, cfg: dict, path: str):
        super().__init__(cfg, path)
        head_dim = cfg.get("head_dim", self.head_dim)
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
            raise ValueError(f"{path}: head_dim must be an even integer, got {head_dim!r}")
        self.head_dim = head_dim

    def qk_norm(self, heads: int):
        return RMSNorm(self.head_dim, self.eps)  # one weight for every head


class Emu35Tokenizer:
    """The text side of the reference's ``Emu3Tokenizer``, read from its two files (see the module docstring)."""

    def __init__(self, folder: str):
        import regex

        ranks_path = require_file(folder, "emu3.tiktoken", what="Emu3.5 text tokenizer")
        vision_path = require_file(folder, "emu3_vision_tokens.txt", what="Emu3.5 vision token list")
        try:
            with open(ranks_path, "rb") as f:
                self.ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in f if line.strip())}
            with open(vision_path, encoding="utf-8") as f:
                vision = [line.strip() for line in f if line.strip()]
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{ranks_path} / {vision_path}: not a tiktoken rank file and a token list ({e})") from e
        missing = [b for b in range(256) if bytes([b]) not in self.ranks]
        if missing:
            raise ValueError(f"{ranks_path} lacks the single-byte tokens {missing[:4]}...: not a byte-level BPE file")
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)] + vision
        start = max(self.ranks.values()) + 1
        self.special = {t: start + i for i, t in enumerate(specials)}
        self.vision = vision
        self._words = regex.compile(PRETOKENIZE)
        self._specials = regex.compile(r"(<\|[^<>|]+\|>)")

    def _bpe(self, piece: bytes) -> list:
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:  # merge the adjacent pair of lowest rank, leftmost first (tiktoken's rule)
            rank, i = min((self.ranks.get(a + b, float("inf")), i) for i, (a, b) in enumerate(zip(parts, parts[1:])))
            if rank == float("inf"):
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ranks[p] for p in parts]

    def encode(self, text: str) -> list:
        ids = []
        for chunk in self._specials.split(unicodedata.normalize("NFC", text)):  # NFC first, as the reference
            if chunk in self.special:
                ids.append(self.special[chunk])
            else:
                for word in self._words.findall(chunk):
                    ids.extend(self._bpe(word.encode("utf-8")))
        return ids


def load_vision_tokenizer(folder: str, device) -> VQGANDecoder:
    """The IBQ decoder of a VisionTokenizer folder (config.yaml + model.safetensors or model.ckpt)."""
    cfg_path = require_file(folder, "config.yaml", what="Emu3.5 VisionTokenizer config")
    weights = require_file(folder, *VQ_WEIGHTS, what="Emu3.5 VisionTokenizer weights")
    dec = VQGANDecoder(**read_vqgan_config(cfg_path))
    load_into(dec, load_state_dict(weights), weights, ignore=("encoder.", "quant_conv.", "loss."))
    return dec.to(device=device).eval()


class Emu35ImageModel(Lumina2ImageModel):
    family = "emu35"

    def __init__(self, folder: str, device=None, dtype=None, resolution=None, vision_tokenizer=None, quantize=None,
                 device_map=None, max_memory=None, offload_folder=None):
        self._open_folder(folder, device, dtype, "emu3.5")
        cfg_path = os.path.join(folder, "config.json")
        raw = read_config(folder)
        c = self.cfg = Emu35Config(raw, cfg_path)
        tok = self.tokenizer = Emu35Tokenizer(folder)
        vq_folder = vision_tokenizer or self._find_vision_tokenizer(folder)
        self.vq = load_vision_tokenizer(vq_folder, self._device)  # before the (large) decoder: fails fast
        V = int(self.vq.quantize.embedding.weight.shape[0])
        codes = [f"<|visual token {i:06d}|>" for i in range(V)]
        if tok.vision[:3] != list(IMAGE_TOKENS) or tok.vision[3:] != codes:
            raise ValueError(f"{os.path.join(folder, 'emu3_vision_tokens.txt')} must list {', '.join(IMAGE_TOKENS)} "
                             f"then <|visual token 000000|> .. <|visual token {V - 1:06d}|> (the {V} codes of "
                             f"{vq_folder}); it lists {len(tok.vision)} tokens")
        s = tok.special
        for key, name in (("bos_token_id", "<|extra_203|>"), ("eol_token_id", ROW_END),
                          ("img_token_id", IMAGE_TOKENS[0]), ("boi_token_id", IMAGE_TOKENS[1])):
            if raw.get(key, s[name]) != s[name]:
                raise ValueError(f"{cfg_path}: {key} {raw.get(key)} but the tokenizer files give {name} id {s[name]}")
        first = s[codes[0]]
        if first + V > c.vocab_size:
            raise ValueError(f"{cfg_path}: vocab_size {c.vocab_size} has no room for the {V} codes at ids {first}..")
        H, W = self._grid(resolution, self.vq.downsample)
        self.max_positions = None  # the rotary embedding has no table; every size offered fits the 32768 context
        self._load_net(folder, quantize, slice(first, first + V), device_map, max_memory, offload_folder)
        self.geometry = ImageGeometry(height=H, width=W, vocab_size=V, row_end=True)
        variant = "image" if "image" in os.path.basename(os.path.normpath(folder)).lower() else "base"
        self.default_sampling = SAMPLING[variant].for_vocab(V)
        self.pad_id, self.eoi_id = s["<|endoftext|>"], s[IMAGE_TOKENS[2]]
        self._image_start = [s[IMAGE_TOKENS[1]]] + tok.encode(f"{H}*{W}") + [s[IMAGE_TOKENS[0]]]
        # engine id -> vocabulary id: the V codes, then the row end
        self._engine_to_model = torch.cat([torch.arange(V) + first, torch.tensor([s[ROW_END]])]).to(self._device)

    @staticmethod
    def _find_vision_tokenizer(folder: str) -> str:
        places = [os.path.join(folder, n) for n in VISION_FOLDERS] + \
            [os.path.join(os.path.dirname(os.path.normpath(folder)), VISION_FOLDERS[1])]
        found = next((p for p in places if os.path.isdir(p)), None)
        if found is None:
            raise ValueError(f"the Emu3.5 VisionTokenizer folder (BAAI/Emu3.5-VisionTokenizer: config.yaml, "
                             f"model.ckpt) was not found at {', '.join(places)}; pass vision_tokenizer=<folder>")
        return found

    def _grid(self, resolution, f: int):
        w, h = parse_pixels(SIZES[0] if resolution is None else resolution, f)
        self.resolution = (w, h)
        return h // f, w // f

    # -- contract ---------------------------------------------------------------------------
    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        uncond = TEMPLATE.format(negative_text) if negative_text else UNCOND
        return EncodedPrompt(cond=self.tokenizer.encode(TEMPLATE.format(text)) + self._image_start,
                             uncond=self.tokenizer.encode(uncond) + self._image_start, text=text,
                             negative_text=negative_text)

    def to_model_ids(self, seq: torch.Tensor) -> torch.Tensor:
        """Engine ids [B, seq_len] of whole images -> vocabulary ids: the last row ends with end-of-image."""
        ids = self._engine_to_model.cpu()[seq.cpu()]
        ids[:, -1] = self.eoi_id
        return ids


def parse_pixels(resolution, f: int = 16) -> tuple:
    """(w, h) of "WxH" in pixels, both positive multiples of `f`; ValueError naming the sizes offered."""
    parts = resolution.lower().replace(" ", "").split("x") if isinstance(resolution, str) else []
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= f and int(p) % f == 0 for p in parts):
        raise ValueError(f"Emu3.5 generates 'WxH' sizes in multiples of {f} px; got resolution {resolution!r} (its "
                         f"recommended sizes: {', '.join(SIZES)})")
    return int(parts[0]), int(parts[1])


def weight_names(folder: str) -> list:
    """Tensor names of a folder's safetensors weights (the index's map, or the single file's header); [] if none."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    try:
        if os.path.isfile(index):
            return list(read_json_object(index)["weight_map"])
        with safe_open(os.path.join(folder, "model.safetensors"), framework="pt") as f:
            return list(f.keys())
    except Exception:  # none, or unreadable here: the loader names the missing or damaged file
        return []


def is_emu35(folder: str, config) -> bool:
    """BAAI's Emu3 config format (model_type "Emu3", as the original Emu3) with per-head query norms, which
    Emu3.5 has and Emu3 has not (or, without readable weights, config.json's explicit head_dim)."""
    model_type, _ = config_names(config)
    if model_type != "Emu3":
        return False
    names = weight_names(folder)
    return any(n.endswith("self_attn.q_norm.weight") for n in names) if names else "head_dim" in config


def size_options(folder: str, w: int, h: int) -> dict:
    parse_pixels(f"{w}x{h}")
    return {"resolution": f"{w}x{h}"}


FAMILY = ModelFamily(
    name=Emu35ImageModel.family, label="Emu3.5 / Emu3.5-Image",
    files="config.json, model*.safetensors, emu3.tiktoken, emu3_vision_tokens.txt and the VisionTokenizer folder",
    load=Emu35ImageModel, detect=is_emu35, sizes="Emu3.5 W x H in multiples of 16 px (1024x1024 and its aspect "
    "ratios recommended)", size_options=size_options, sampling=tuple(SAMPLING.values()), resolutions=SIZES,
    quantize=True, offload=True)
