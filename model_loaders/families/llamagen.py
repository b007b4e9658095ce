"""LlamaGen (FoundationVision): class-conditional (c2i) and text-conditional (t2i) image GPTs,
our own implementation over the shared slot cache, loading the authors' released checkpoints
(``c2i_{B,L,XL,XXL,XXXL}_{256,384}.pt``, ``t2i_XL_stage{1,2}_{256,512}.pt``; weights under
``model`` / ``module`` / ``state_dict``, opened with ``weights_only=True``, or their safetensors
conversion) with the authors' parameter names.

What the authors' model does and this one reproduces, and the prompts: docs/MODELS.md, "LlamaGen in detail".
"""
from __future__ import annotations

import os
import re
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..devices import resolve_dtype
from ..family import ModelFamily, Sampling, choose_square_size
from ..files.checkpoints import load_into, load_state_dict
from ..kv.slot_model import SlotCacheModel
from ..kv.store import SlotKV, attend, write_slots
from ..precision.quantize import quantize_module
from .hf_common import decode_in_chunks
from ..llama_decoder import RMSNorm
from .llamagen_vq import load_llamagen_vq

# heads of the authors' GPT sizes, by width (gpt.py GPT_models: B, L, XL, XXL, XXXL, 1B, 3B, 7B)
HEADS_BY_DIM = {768: 12, 1024: 16, 1280: 20, 1536: 24, 2560: 40, 2048: 32, 3200: 32, 4096: 32}
GPT_FILE = re.compile(r"^(c2i|t2i)_.*?(\d+)\.(pt|pth|safetensors)$")
T5_FOLDERS = ("flan-t5-xl", "t5")
# the released checkpoints' sizes: c2i 256 and 384 (c2i_*_256.pt / c2i_*_384.pt), t2i 256 and 512 (stage 1 / 2)
LLAMAGEN_SIZES = (256, 384, 512)
CAPTION_TOKENS = 120  # t2i condition length (the authors' --cls-token-num / t5 max length)
WEIGHT_EXTENSIONS = (".pt", ".pth", ".safetensors")
# the authors' sampling scripts: c2i CFG 4.0 / top-k 2000, t2i CFG 7.5 / top-k 1000
SAMPLING = {"c2i": Sampling("LlamaGen c2i", 4.0, 2000), "t2i": Sampling("LlamaGen t2i", 7.5, 1000)}


class LlamaGenConfig:
    def __init__(self, state: dict, path: str, n_head: Optional[int] = None):
        try:
            self.vocab_size, self.dim = map(int, state["tok_embeddings.weight"].shape)
            self.n_layer = len({k.split(".")[1] for k in state if k.startswith("layers.")})
            qkv_rows = int(state["layers.0.attention.wqkv.weight"].shape[0])
            self.ffn = int(state["layers.0.feed_forward.w1.weight"].shape[0])
        except KeyError as e:
            raise ValueError(f"{path} is not a LlamaGen GPT checkpoint (no {e} weight)") from e
        self.n_head = n_head or HEADS_BY_DIM.get(self.dim)
        if not self.n_head or self.dim % self.n_head:
            raise ValueError(f"{path}: width {self.dim} is not one of the authors' GPT sizes "
                             f"({', '.join(map(str, HEADS_BY_DIM))}); pass n_head=... to load_model")
        self.head_dim = self.dim // self.n_head
        self.n_kv_head = (qkv_rows // self.head_dim - self.n_head) // 2
        if "cls_embedding.embedding_table.weight" in state:
            self.kind, self.cls_tokens = "c2i", 1
            self.num_classes = int(state["cls_embedding.embedding_table.weight"].shape[0]) - 1
        elif "cls_embedding.cap_proj.fc1.weight" in state:
            self.kind = "t2i"
            self.caption_dim = int(state["cls_embedding.cap_proj.fc1.weight"].shape[1])
            self.cls_tokens = int(state["cls_embedding.uncond_embedding"].shape[0])
        else:
            raise ValueError(f"{path} has neither cls_embedding.embedding_table (c2i) nor cls_embedding.cap_proj (t2i)")


def rope_2d(grid: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """[1 + grid^2, head_dim // 2, 2] (cos, sin): row 0 is the condition tokens' all-zero table,
    row 1 + j is grid cell j (raster order)."""
    half = head_dim // 2
    inv = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    f = torch.outer(torch.arange(grid).float(), inv)  # [G, head_dim // 4]
    cells = torch.cat([f[:, None, :].expand(grid, grid, -1), f[None, :, :].expand(grid, grid, -1)], -1)
    table = torch.stack([cells.cos(), cells.sin()], -1).flatten(0, 1)
    return torch.cat([torch.zeros(1, half, 2), table])


def apply_rope(x, rot):
    # x [R, T, H, hd]; rot [R, T, hd // 2, 2]; rotation of interleaved (even, odd) pairs, in fp32
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = rot[:, :, None, :, 0], rot[:, :, None, :, 1]
    out = torch.stack([xs[..., 0] * c - xs[..., 1] * s, xs[..., 1] * c + xs[..., 0] * s], -1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.h, self.kv, self.hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, rot, kv, rows, slots, mask):
        R, T, _ = x.shape
        q, k, v = self.wqkv(x).split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
        q = apply_rope(q.view(R, T, self.h, self.hd), rot).transpose(1, 2)
        k = apply_rope(k.view(R, T, self.kv, self.hd), rot)
        out = attend(q, write_slots(kv, k, v.view(R, T, self.kv, self.hd), slots, rows), mask)
        return self.wo(out.transpose(1, 2).reshape(R, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(cfg.dim, 1e-5), RMSNorm(cfg.dim, 1e-5)
        self.attention, self.feed_forward = Attention(cfg), FeedForward(cfg)

    def forward(self, x, rot, kv, rows, slots, mask):
        h = x + self.attention(self.attention_norm(x), rot, kv, rows, slots, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class CaptionMLP(nn.Module):
    def __init__(self, cin, dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(cin, dim, bias=False), nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class LlamaGenGPT(nn.Module):
    """The authors' Transformer, parameter for parameter (inference only)."""

    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.cfg = cfg
        self.cls_embedding = nn.Module()
        if cfg.kind == "c2i":
            self.cls_embedding.embedding_table = nn.Embedding(cfg.num_classes + 1, cfg.dim)
        else:
            self.cls_embedding.cap_proj = CaptionMLP(cfg.caption_dim, cfg.dim)
            self.cls_embedding.register_buffer("uncond_embedding", torch.zeros(cfg.cls_tokens, cfg.caption_dim))
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, 1e-5)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)


class LlamaGenKV(SlotKV):
    """The slot cache, remembering where each row's image starts (`pos0`: [R] position of image code 0, the
    prompt's length, set by the prefill)."""

    pos0 = None

    def forget_session(self) -> None:  # what besides its tensors a new session must not inherit (reset_cache)
        self.pos0 = None


class LlamaGenImageModel(SlotCacheModel):
    family = "llamagen"
    pad_id = 0

    def __init__(self, folder: str, device=None, dtype=None, image_size=None, n_head=None, t5_dtype=None,
                 quantize=None):
        self._open_folder(folder, device, dtype, "llamagen")
        gpt_path, vq_path = self._files(folder)
        self.vq = load_llamagen_vq(vq_path, device=self._device)
        state = load_state_dict(gpt_path)
        cfg = self.cfg = LlamaGenConfig(state, gpt_path, n_head)
        size = image_size or int(GPT_FILE.match(os.path.basename(gpt_path)).group(2))
        f = self.vq.downsample
        if isinstance(size, bool) or not isinstance(size, int) or size % f or size < f:
            raise ValueError(f"image_size must be a multiple of the VQ's {f}x downsampling (LlamaGen: 256, 384 or "
                             f"512, the number in the checkpoint's name), got {size!r}")
        V = int(self.vq.quantize.embedding.weight.shape[0])
        if V != cfg.vocab_size:
            raise ValueError(f"{gpt_path} predicts {cfg.vocab_size} codes but the VQ tokenizer {vq_path} has {V}")
        G = size // f
        default = torch.get_default_dtype()
        torch.set_default_dtype(self._dtype)  # built in the target dtype: no float32 copy of a large model
        try:
            self.gpt = LlamaGenGPT(cfg)
        finally:
            torch.set_default_dtype(default)
        load_into(self.gpt, state, gpt_path, ignore=("freqs_cis", "causal_mask"))
        del state
        # quantized (precision/quantize.py) in CPU memory, before the move: the device holds the quantized weights only
        self.gpt = self.gpt.to(dtype=self._dtype)
        quantize_module(self.gpt, quantize)
        self.gpt = self.gpt.to(device=self._device).eval()
        self.register_rope(G)
        self.geometry = ImageGeometry(height=G, width=G, vocab_size=V)
        self.default_sampling = SAMPLING[cfg.kind].for_vocab(V)
        self.max_positions = None  # rotary cells past the image are never read (clamped)
        self._captions = {}  # text -> virtual prompt ids (rows of self._caption_table)
        if cfg.kind == "t2i":
            self._load_t5(folder, t5_dtype)
            self._caption_table = self.gpt.cls_embedding.uncond_embedding.float().clone()

    # -- files -----------------------------------------------------------------------------
    @staticmethod
    def _files(folder):
        names = sorted(os.listdir(folder))
        gpts = [n for n in names if GPT_FILE.match(n)]
        vqs = [n for n in names if n.startswith("vq_") and n.endswith(WEIGHT_EXTENSIONS)]
        if len(gpts) != 1 or len(vqs) != 1:
            raise ValueError(f"a LlamaGen folder needs exactly one GPT checkpoint (c2i_*_<size>.pt or t2i_*_<size>.pt) "
                             f"and one VQ checkpoint (vq_ds16_*.pt) (or their .safetensors conversions); {folder!r} "
                             f"has GPT {gpts or 'none'} and VQ {vqs or 'none'}")
        return os.path.join(folder, gpts[0]), os.path.join(folder, vqs[0])

    def _load_t5(self, folder, t5_dtype):
        from transformers import T5EncoderModel

        from ..files.hf_files import load_pretrained, load_tokenizer
        sub = next((os.path.join(folder, n) for n in T5_FOLDERS if os.path.isdir(os.path.join(folder, n))), None)
        if sub is None:
            raise ValueError(f"a LlamaGen t2i folder needs the FLAN-T5-XL text encoder in {folder!r}/flan-t5-xl "
                             f"(transformers format: config.json, model.safetensors, tokenizer files)")
        self.t5_tokenizer = load_tokenizer(sub)
        self.t5 = load_pretrained(T5EncoderModel, sub, self._device, resolve_dtype(t5_dtype, self._device))
        if self.t5.config.d_model != self.cfg.caption_dim:
            raise ValueError(f"{sub}/config.json: d_model {self.t5.config.d_model} but the GPT's caption projection "
                             f"takes {self.cfg.caption_dim} (FLAN-T5-XL: 2048)")

    def register_rope(self, G):
        self._rope = rope_2d(G, self.cfg.head_dim).to(self._device)

    # -- contract ---------------------------------------------------------------------------
    @property
    def hidden_size(self):
        return self.cfg.dim

    def torch_module(self):
        return self.gpt

    def class_index(self, text: str) -> int:
        m = re.fullmatch(r"\s*(?:class\s*:\s*)?(\d+)\s*", text)
        if m is None or int(m.group(1)) >= self.cfg.num_classes:
            raise ValueError(f"this LlamaGen model is class-conditional: the prompt must be a class index 0.."
                             f"{self.cfg.num_classes - 1} written as '207' or 'class:207', got {text!r}")
        return int(m.group(1))

    @torch.inference_mode()
    def _caption_ids(self, text: str) -> list:
        """Virtual ids of the T5 states of `text` (rows appended to the caption table once)."""
        text = text.lower().strip()
        if text not in self._captions:
            ids = self.t5_tokenizer(text, max_length=self.cfg.cls_tokens, truncation=True,
                                    add_special_tokens=True, return_tensors="pt").input_ids.to(self.t5.device)
            states = self.t5(input_ids=ids).last_hidden_state[0].float().to(self._caption_table.device)
            start = self._caption_table.shape[0]
            self._caption_table = torch.cat([self._caption_table, states])
            self._captions[text] = list(range(start, start + states.shape[0]))
        return self._captions[text]

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        if self.cfg.kind == "c2i":
            if negative_text:
                raise ValueError("class-conditional LlamaGen takes no negative prompt (its CFG branch is the null class)")
            return EncodedPrompt(cond=[self.class_index(text)], uncond=[self.cfg.num_classes], text=text)
        cond = self._caption_ids(text)
        n, T = len(cond), self.cfg.cls_tokens
        uncond = self._caption_ids(negative_text) if negative_text else list(range(T - n, T))
        return EncodedPrompt(cond=cond, uncond=uncond, text=text, negative_text=negative_text)

    # -- SlotCacheModel hooks ----------------------------------------------------------------
    def _new_cache(self, rows, capacity):
        c = self.cfg
        return LlamaGenKV(c.n_layer, rows, c.n_kv_head, capacity, c.head_dim, self._dtype, self._device)

    def _embed_prompt(self, ids):
        ce = self.gpt.cls_embedding
        if self.cfg.kind == "c2i":
            return ce.embedding_table(ids)
        rows = self._caption_table.to(self._device)[ids]
        return ce.cap_proj(rows.to(self._dtype))

    def embed_tokens(self, tokens):
        return self.gpt.tok_embeddings(tokens)

    def _run(self, embeds, positions, allowed, cache: LlamaGenKV, slots):
        if cache.pos0 is None:  # the prefill: every row's prompt ends at its last position
            cache.pos0 = positions[:, -1] + 1
        cell = (positions - cache.pos0[:, None] + 1).clamp(0, self._rope.shape[0] - 1)  # 0: condition token
        rot = self._rope[cell]
        rows = torch.arange(embeds.shape[0], device=embeds.device)[:, None]
        x = embeds
        for layer, kv in zip(self.gpt.layers, cache.layers):
            x = layer(x, rot, kv, rows, slots, allowed)
        return self.gpt.norm(x)

    def image_logits(self, hidden):
        return self.gpt.output(hidden)

    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor, chunk: int = 8, prompt=None):
        return decode_in_chunks(self.vq, tokens, self._device, chunk)


def is_llamagen(folder: str, config) -> bool:
    """No config.json: the authors' GPT checkpoint (c2i_* / t2i_*) next to their VQ tokenizer (vq_*)."""
    if config is not None:
        return False
    names = os.listdir(folder)
    return any(n.startswith(("c2i_", "t2i_")) and n.endswith(WEIGHT_EXTENSIONS) for n in names) and \
        any(n.startswith("vq_") and n.endswith(WEIGHT_EXTENSIONS) for n in names)


FAMILY = ModelFamily(
    name=LlamaGenImageModel.family, label="LlamaGen", files="its authors' c2i_* / t2i_* and vq_* checkpoints",
    load=LlamaGenImageModel, detect=is_llamagen, sizes="LlamaGen 256 / 384 / 512 squares",
    size_options=choose_square_size("LlamaGen", LLAMAGEN_SIZES), resolutions=tuple(f"{s}x{s}" for s in LLAMAGEN_SIZES),
    sampling=tuple(SAMPLING.values()), quantize=True)
