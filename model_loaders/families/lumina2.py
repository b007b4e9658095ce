"""Lumina-mGPT 2.0 (Alpha-VLLM): a 7B decoder-only text-to-image model trained from scratch,
768 px, our own implementation over the shared slot cache, loading the released checkpoint
folder (``Alpha-VLLM/Lumina-mGPT-2.0``) from safetensors with its own tensor names.

Why not transformers' Chameleon class (the checkpoint's per-group q / k norms, no VQ encoder, the image rows
of the LM head only): docs/MODELS.md.

What the authors' model computes and this one reproduces (config.json keys), the prompt layout and the pixel
decoder: docs/MODELS.md, "Lumina-mGPT 2.0 in detail".
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from .. import offload
from ..contract import EncodedPrompt, ImageGeometry, check_texts
from ..family import ModelFamily, Sampling, config_names, read_config
from ..files.checkpoints import weight_mismatch
from ..files.hf_files import load_tokenizer, safetensors_files
from ..kv.slot_model import SlotCacheModel
from ..kv.store import SlotKV, attend, write_slots
from ..precision.quantize import check_mode, quantize_module
from .chameleon import LUMINA_PATCH, lumina_grid, lumina_sizes
from .hf_common import decode_in_chunks
from ..llama_decoder import RMSNorm, apply_rope
from .lumina2_vq import load_movqgan

IMAGE_TOKEN_OFFSET = 155000  # vocabulary id of image code 0 (the authors' get_image_token)
IMAGE_START, IMAGE_END = "<racm3:break>", "<eoss>"
SEP, NEWLINE = "<reserved08706>", "<reserved08799>"
PROMPT = "Generate an image of {w}x{h} according to the following prompt:\n{text}"
TARGET_SIZE = 768  # the released checkpoint's training size (its crop list: (768 / 32)^2 patches, ratio <= 4)
VQ_FILES = ("movqgan_270M.safetensors", "movqgan_270M.ckpt")
IGNORED_WEIGHTS = ("model.vqmodel.", "rotary_emb.")  # Chameleon's VQ encoder (unused; absent in the release)
# the authors' README and scripts/sample.sh: CFG 4.0, image top-k 4096, temperature 1.0
SAMPLING = Sampling("Lumina-mGPT 2.0", 4.0, 4096)


class Lumina2Config:
    """The decoder's shape from config.json; a ValueError naming the file and the key otherwise."""

    def __init__(self, cfg: dict, path: str):
        def get(key, kind, default=None):
            value = cfg.get(key)
            value = default if value is None else value  # absent or null: the authors' ChameleonConfig default
            ok = isinstance(value, bool) if kind is bool else \
                isinstance(value, kind) and not isinstance(value, bool)
            if not ok:
                what = {bool: "true or false", int: "an integer"}.get(kind, "a number")
                raise ValueError(f"{path}: {key} must be {what}, got {value!r}")
            return value

        self.vocab_size = get("vocab_size", int)
        self.dim = get("hidden_size", int)
        self.ffn = get("intermediate_size", int)
        self.n_layer = get("num_hidden_layers", int)
        self.n_head = get("num_attention_heads", int)
        self.n_kv_head = get("num_key_value_heads", int, self.n_head)
        self.groups = get("model_parallel_size", int, 1)
        self.eps = float(get("rms_norm_eps", (int, float), 1e-5))
        self.rope_theta = float(get("rope_theta", (int, float), 10000.0))
        self.swin_norm = get("swin_norm", bool, False)
        self.attention_bias = get("attention_bias", bool, False)
        self.mlp_bias = get("mlp_bias", bool, False)
        self.tied = get("tie_word_embeddings", bool, False)
        if self.dim % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"{path}: hidden_size {self.dim} / num_attention_heads {self.n_head} / "
                             f"num_key_value_heads {self.n_kv_head} do not divide")
        if self.n_head % self.groups or self.n_kv_head % self.groups:
            raise ValueError(f"{path}: model_parallel_size {self.groups} must divide num_attention_heads "
                             f"{self.n_head} and num_key_value_heads {self.n_kv_head}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{path}: hidden_act {cfg.get('hidden_act')!r}; only silu is supported")
        if cfg.get("rope_scaling") is not None:
            raise ValueError(f"{path}: rope_scaling {cfg.get('rope_scaling')!r} is not supported (the released "
                             f"checkpoint has none)")
        self.head_dim = self.dim // self.n_head

    def qk_norm(self, heads: int) -> nn.Module:
        """The query / key norm of `heads` heads (emu35.py: Qwen3's RMS norm instead)."""
        return GroupNormQK(self.groups, self.head_dim, heads)


class GroupNormQK(nn.Module):
    """Chameleon's query / key norm as the authors store it: layer norm over the head dimension, then
    the weight and bias of the head's model-parallel group ([groups, head_dim], repeated per head)."""

    def __init__(self, groups: int, head_dim: int, heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(groups, head_dim))
        self.bias = nn.Parameter(torch.zeros(groups, head_dim))
        self.per_group = heads // groups

    def forward(self, x):  # [R, T, heads, head_dim]
        x = F.layer_norm(x, x.shape[-1:], eps=1e-5)
        return x * self.weight.repeat_interleave(self.per_group, 0) + self.bias.repeat_interleave(self.per_group, 0)


class Attention(nn.Module):
    def __init__(self, c: Lumina2Config):
        super().__init__()
        self.h, self.kv, self.hd = c.n_head, c.n_kv_head, c.head_dim
        self.q_proj = nn.Linear(c.dim, c.n_head * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.dim, c.n_kv_head * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.dim, c.n_kv_head * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.n_head * c.head_dim, c.dim, bias=c.attention_bias)
        self.q_norm, self.k_norm = c.qk_norm(c.n_head), c.qk_norm(c.n_kv_head)

    def forward(self, x, cos, sin, kv, rows, slots, mask):
        R, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(R, T, self.h, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(R, T, self.kv, self.hd)).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [R, heads, T, hd]
        kv = write_slots(kv, k.transpose(1, 2), self.v_proj(x).view(R, T, self.kv, self.hd), slots, rows)
        out = attend(q, kv, mask)
        return self.o_proj(out.transpose(1, 2).reshape(R, T, -1))


class MLP(nn.Module):
    def __init__(self, c: Lumina2Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.dim, c.ffn, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.dim, c.ffn, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.ffn, c.dim, bias=c.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: Lumina2Config):
        super().__init__()
        self.swin = c.swin_norm
        self.self_attn, self.mlp = Attention(c), MLP(c)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(c.dim, c.eps), RMSNorm(c.dim, c.eps)

    def forward(self, x, cos, sin, kv, rows, slots, mask):
        if self.swin:  # norms after the sublayers (Chameleon's swin_norm)
            x = x + self.input_layernorm(self.self_attn(x, cos, sin, kv, rows, slots, mask))
            return x + self.post_attention_layernorm(self.mlp(x))
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, rows, slots, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Lumina2Net(nn.Module):
    """The checkpoint's module tree (``model.embed_tokens``, ``model.layers.N``, ``model.norm``,
    ``lm_head``), inference only."""

    def __init__(self, c: Lumina2Config):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c.vocab_size, c.dim)
        self.model.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_layer))
        self.model.norm = RMSNorm(c.dim, c.eps)
        self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)


def load_weights(folder: str, c: Lumina2Config, dtype, device, head_rows: slice) -> Lumina2Net:
    """The net with the folder's safetensors weights: every tensor present with its config shape,
    nothing else but `IGNORED_WEIGHTS`; read one tensor at a time in `dtype` onto `device` (or `device(meta net)[name]`:
    offload.py; no second copy of a 7B model), and of ``lm_head`` only the rows in `head_rows` (the image codes)."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        net = Lumina2Net(c)
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    net.lm_head = nn.Linear(c.dim, len(range(c.vocab_size)[head_rows]), bias=False, device="meta")  # image rows only
    place = device(net) if callable(device) else device
    files = safetensors_files(folder)
    where = files[0] if len(files) == 1 else os.path.join(folder, "model.safetensors.index.json")
    state, extra, wrong = {}, [], {}
    for path in files:
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key not in expected:
                        if not key.startswith(IGNORED_WEIGHTS):
                            extra.append(key)
                        continue
                    part = f.get_slice(key)
                    shape = tuple(part.get_shape())
                    if shape != expected[key]:
                        wrong[key] = f"{key} {shape} vs {expected[key]}"
                        continue
                    t = part[head_rows] if key == "lm_head.weight" else part[:]
                    state[key] = t.to(device=place[key] if isinstance(place, dict) else place, dtype=dtype)
        except (SafetensorError, OSError) as e:  # a damaged or partly copied file
            raise ValueError(f"{path} is not a valid safetensors file ({e}); a damaged or partly downloaded "
                             f"file? copy it again") from e
    if c.tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"][head_rows]  # the head is the embedding
    problems = weight_mismatch(sorted(set(expected) - set(state) - set(wrong)), sorted(extra),
                               [wrong[k] for k in sorted(wrong)])
    if problems:
        raise ValueError(f"weights in {where} do not match {os.path.join(folder, 'config.json')}: {problems}")
    net.load_state_dict(state, assign=True, strict=True)
    return net.eval()


class Lumina2ImageModel(SlotCacheModel):
    family = "lumina2"

    def __init__(self, folder: str, device=None, dtype=None, resolution=None, target_size=None, quantize=None):
        self._open_folder(folder, device, dtype, "lumina-mgpt-2")
        cfg_path = os.path.join(folder, "config.json")
        c = self.cfg = Lumina2Config(read_config(folder), cfg_path)
        tok = self.tokenizer = load_tokenizer(folder)
        vocab = tok.get_vocab()
        vq_path = next((os.path.join(folder, n) for n in VQ_FILES if os.path.isfile(os.path.join(folder, n))), None)
        if vq_path is None:
            raise ValueError(f"the image tokenizer {' or '.join(VQ_FILES)} is missing in {folder!r}: copy "
                             f"movqgan_270M.ckpt from ai-forever/MoVQGAN (or its safetensors conversion)")
        self.vq = load_movqgan(vq_path, device=self._device)  # before the (large) decoder: fails fast
        V = int(self.vq.quantize.embedding.weight.shape[0])
        if IMAGE_TOKEN_OFFSET + V > c.vocab_size:
            raise ValueError(f"{cfg_path}: vocab_size {c.vocab_size} has no room for the {V} image codes of {vq_path} "
                             f"at ids {IMAGE_TOKEN_OFFSET}..{IMAGE_TOKEN_OFFSET + V - 1}")
        for name in (IMAGE_START, IMAGE_END, SEP, NEWLINE):
            if name not in vocab:
                raise ValueError(f"the tokenizer in {folder!r} has no {name} token, which Lumina-mGPT 2.0's "
                                 f"layout needs")
        self.boi_id, self.eoi_id, self.sep_id = vocab[IMAGE_START], vocab[IMAGE_END], vocab[SEP]
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if self.bos_id is None:
            raise ValueError(f"the tokenizer in {folder!r} defines neither a bos nor an eos token")
        H, W = self._grid(resolution, target_size, self.vq.downsample, vocab)
        # config.json's max_position_embeddings is not a limit here: the rotary embedding has no table, the
        # authors' generate runs past it (max_new_tokens 10240 overrides max_length), and every size offered is
        # one of the training crop sizes
        self.max_positions = None
        self._load_net(folder, quantize, slice(IMAGE_TOKEN_OFFSET, IMAGE_TOKEN_OFFSET + V))
        self.geometry = ImageGeometry(height=H, width=W, vocab_size=V, row_end=True)
        self.default_sampling = SAMPLING.for_vocab(V)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eoi_id
        # engine id -> vocabulary id: the V codes, then the row-end newline
        self._engine_to_model = torch.cat([torch.arange(V) + IMAGE_TOKEN_OFFSET,
                                           torch.tensor([vocab[NEWLINE]])]).to(self._device)

    def _load_net(self, folder: str, quantize, head_rows: slice, device_map=None, max_memory=None, offload_folder=None):
        """`self.net` from the folder's weights (the LM head's `head_rows` only) and the rotary frequencies; with
        ``device_map="auto"`` what does not fit the device is placed by accelerate (offload.py)."""
        c, quantize = self.cfg, check_mode(quantize)
        # quantized (precision/quantize.py) in CPU memory, before the move: the device holds the quantized weights only
        place = "cpu" if quantize != "none" else self._device
        if device_map is not None:
            place = offload.placement("model.layers", device_map, self._device, self._dtype, max_memory)
        self.net = load_weights(folder, c, self._dtype, place, head_rows)
        if quantize != "none":
            quantize_module(self.net, quantize)
            self.net = self.net.to(device=self._device)
        if device_map is not None:
            self.net = offload.dispatch(self.net, self._device, offload_folder)
        self._inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=self._device).float()
                                                 / c.head_dim))

    def _grid(self, resolution, target_size, f, vocab):
        if target_size is None:
            target_size = TARGET_SIZE
        if isinstance(target_size, bool) or not isinstance(target_size, int) or target_size < LUMINA_PATCH or \
                target_size % LUMINA_PATCH:
            raise ValueError(f"target_size must be a multiple of {LUMINA_PATCH} (Lumina-mGPT 2.0 is trained at "
                             f"{TARGET_SIZE}), got {target_size!r}")
        return lumina_grid(self, "Lumina-mGPT 2.0", resolution, target_size, f, vocab)

    # -- contract ---------------------------------------------------------------------------
    @property
    def hidden_size(self):
        return self.cfg.dim

    def torch_module(self):
        return self.net

    def _ids(self, text: str) -> list:
        w, h = self.resolution
        body = self.tokenizer(PROMPT.format(w=w, h=h, text=text), add_special_tokens=False).input_ids
        return [self.bos_id] + list(body) + [self.sep_id, self.boi_id] + self.size_ids

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        check_texts(text, negative_text)
        uncond = self._ids(negative_text) if negative_text else [self.boi_id] + self.size_ids
        return EncodedPrompt(cond=self._ids(text), uncond=uncond, text=text, negative_text=negative_text)

    def to_model_ids(self, seq: torch.Tensor) -> torch.Tensor:
        """Engine ids [B, seq_len] -> vocabulary ids followed by end-of-image."""
        ids = self._engine_to_model.cpu()[seq.cpu()]
        return torch.cat([ids, torch.full((ids.shape[0], 1), self.eoi_id)], 1)

    # -- SlotCacheModel hooks ----------------------------------------------------------------
    def _new_cache(self, rows, capacity):
        c = self.cfg
        return SlotKV(c.n_layer, rows, c.n_kv_head, capacity, c.head_dim, self._dtype, self._device)

    def _embed_prompt(self, ids):
        return self.net.model.embed_tokens(ids)

    def embed_tokens(self, tokens):
        return self.net.model.embed_tokens(self._engine_to_model[tokens])

    def _run(self, embeds, positions, allowed, cache: SlotKV, slots):
        freqs = positions.float()[..., None] * self._inv_freq  # [R, T, hd / 2], in fp32 as the authors
        angles = torch.cat([freqs, freqs], -1)[:, None]
        cos, sin = angles.cos().to(embeds.dtype), angles.sin().to(embeds.dtype)
        rows = torch.arange(embeds.shape[0], device=embeds.device)[:, None]
        x = embeds
        for layer, kv in zip(self.net.model.layers, cache.layers):
            x = layer(x, cos, sin, kv, rows, slots, allowed)
        return self.net.model.norm(x)

    def image_logits(self, hidden):
        return self.net.lm_head(hidden)

    @torch.inference_mode()
    def decode_tokens(self, tokens: torch.Tensor, chunk: int = 4, prompt=None):
        return decode_in_chunks(self.vq, tokens, self._device, chunk)


def is_lumina2(folder: str, config) -> bool:
    """A Chameleon-type config.json whose vocabulary reaches past the image-token offset (Lumina-mGPT
    and Anole have 65536 ids; Lumina-mGPT 2.0 places its codes at 155000 and up)."""
    model_type, _ = config_names(config)
    size = (config or {}).get("vocab_size")
    return model_type == "chameleon" and isinstance(size, int) and size > IMAGE_TOKEN_OFFSET


def size_options(folder: str, w: int, h: int) -> dict:
    if (w, h) in lumina_sizes(TARGET_SIZE):
        return {"resolution": f"{w}x{h}"}
    raise ValueError(f"Lumina-mGPT 2.0 does not offer {w}x{h}; it offers (WxH) "
                     f"{', '.join(f'{a}x{b}' for a, b in lumina_sizes(TARGET_SIZE))}")


FAMILY = ModelFamily(
    name=Lumina2ImageModel.family, label="Lumina-mGPT 2.0",
    files="config.json, model*.safetensors, tokenizer files and movqgan_270M.ckpt",
    load=Lumina2ImageModel, detect=is_lumina2,
    sizes=f"Lumina-mGPT 2.0 its {TARGET_SIZE} px sizes (32-px patches, aspect ratio <= 4)",
    size_options=size_options, sampling=(SAMPLING,),
    resolutions=tuple(f"{w}x{h}" for w, h in lumina_sizes(TARGET_SIZE)), quantize=True)
