"""Shared machinery for adapters over transformers models (Janus-Pro, Emu3, ...).

The adapters drive the family's own transformers decoder (``LlamaModel`` inside Janus,
``Emu3TextModel`` inside Emu3) directly, layer stack only, with:

- `SlotCache`: a preallocated static KV cache, a transformers ``Cache`` whose ``update`` writes
  the new keys/values of every row at that row's own slots (set before each forward) and returns
  the whole static tensors. Rows of a batch therefore hold different committed lengths, rollback
  is free (uncommitted slots are masked and later overwritten) and shapes are fixed.
- an explicit FLOAT additive 4D attention mask ``(R, 1, T, S)`` in the model dtype (0 = attend,
  ``finfo.min`` = blocked; transformers passes a 4D mask through unchanged) and explicit
  ``position_ids`` (left padding, tree nodes at prefix length + depth).

Slot layout per internal row r (the same as `llama_adapter`): the left-padded prompt fills slots
``0..P-1`` (its last token at ``P-1``); sequence position j lives at slot ``P + j``; draft node i
of a forward is written to slot ``P + committed + i``; `commit` gathers an accepted tree path to
consecutive slots.

Also here: safe loading (safetensors only, no remote code, nothing downloaded, clear errors for a
config/weights mismatch and missing files, a memory check with the size needed), dtype parsing,
and pixel conversion.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import torch

from safetensors import SafetensorError

from .registry import transformers_version
from .slot_model import SlotCacheModel

try:  # transformers >= 4.5x: the Cache / layer classes this cache plugs into
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError:  # pragma: no cover - very old transformers
    Cache, CacheLayerMixin = object, object


# ----------------------------------------------------------------------------------------------
# files, dtypes, loading
# ----------------------------------------------------------------------------------------------
DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}


def resolve_device(device) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be e.g. 'cpu', 'cuda' or 'cuda:0', got {device!r}") from e


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    """None/'auto': bf16 on CUDA, fp32 elsewhere; else one of bf16/fp16/fp32 (or a torch dtype)."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"dtype must be bf16, fp16 or fp32, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ValueError(f"dtype must be one of bf16, fp16, fp32 (or auto), got {dtype!r}")


def require_file(folder: str, *names: str, what: str) -> str:
    """The first of `names` present in `folder`, or a ValueError naming the file(s) and their role."""
    for n in names:
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            return p
    raise ValueError(f"{what} file {' or '.join(names)} is missing in {folder!r} "
                     f"(copy it from the checkpoint's repository; nothing is downloaded)")


def safetensors_files(folder: str) -> list:
    """The weight files of a checkpoint; pickle-only checkpoints are refused."""
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{index} is not a valid safetensors index: {e}") from e
        files = [os.path.join(folder, n) for n in names]
        for p in files:
            if not os.path.isfile(p):
                raise ValueError(f"weight file {p} listed in {index} is missing")
        return files
    if os.path.isfile(single):
        return [single]
    pickles = [n for n in os.listdir(folder) if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    if pickles:
        raise ValueError(f"{folder!r} has only pickle weights ({', '.join(sorted(pickles))}); SpecAR loads "
                         f"safetensors only (model.safetensors or model.safetensors.index.json)")
    raise ValueError(f"weights file model.safetensors (or model.safetensors.index.json) is missing in {folder!r}")


def weight_bytes(files: Sequence[str], dtype: torch.dtype) -> int:
    """Bytes the weights take in `dtype` (floating tensors converted), from the safetensors headers."""
    size = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
    floating = {"F64", "F32", "F16", "BF16"}
    target = torch.finfo(dtype).bits // 8
    total = 0
    for p in files:
        try:
            with open(p, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
        except (OSError, ValueError) as e:
            raise ValueError(f"{p} is not a valid safetensors file: {e}") from e
        for name, info in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in info["shape"]:
                numel *= d
            total += numel * (target if info["dtype"] in floating else size.get(info["dtype"], 4))
    return total


def check_memory(files, dtype: torch.dtype, device: torch.device, device_map, extra_bytes: int = 0) -> None:
    """A model that cannot fit on one GPU fails before loading, with the memory it needs."""
    if device.type != "cuda" or device_map is not None:
        return
    need = weight_bytes(files, dtype) + extra_bytes
    try:
        free, total = torch.cuda.mem_get_info(device)
    except Exception:  # pragma: no cover - no CUDA runtime
        return
    if need > free:
        gib = 1024 ** 3
        raise ValueError(f"the model needs about {need / gib:.1f} GiB of GPU memory in {str(dtype).split('.')[-1]} "
                         f"but {device} has {free / gib:.1f} GiB free (of {total / gib:.1f} GiB); use "
                         f"dtype='bf16', or device_map='auto' (accelerate: spreads layers over GPUs and CPU "
                         f"offload), or a smaller checkpoint")


def load_pretrained(cls, folder: str, device: torch.device, dtype: torch.dtype, device_map=None, max_memory=None,
                    offload_folder=None, attn_implementation: Optional[str] = None, allow_missing=()):
    """`cls.from_pretrained` from a local folder only: safetensors, no remote code, and every
    checkpoint tensor must match the config (no silently random-initialised weights), except
    missing parameters under the `allow_missing` prefixes (parts image generation never runs)."""
    files = safetensors_files(folder)
    check_memory(files, dtype, device, device_map)
    # transformers >= 4.56 takes `dtype`; before, the same setting was `torch_dtype`
    kwargs = {"dtype" if transformers_version() >= (4, 56) else "torch_dtype": dtype}
    kwargs.update(local_files_only=True, use_safetensors=True, trust_remote_code=False, output_loading_info=True)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if device_map is not None:
        kwargs["device_map"] = device_map
        if max_memory is not None:
            kwargs["max_memory"] = max_memory
        if offload_folder is not None:
            kwargs["offload_folder"] = offload_folder
    weights = files[0] if len(files) == 1 else os.path.join(folder, "model.safetensors.index.json")
    try:
        model, info = cls.from_pretrained(folder, **kwargs)
    except SafetensorError as e:
        raise ValueError(f"cannot read the weights in {weights}: {e} (a damaged or partly downloaded file? copy "
                         f"it again)") from e
    except (RuntimeError, ValueError, OSError, KeyError) as e:
        msg = str(e)
        if "mismatch" in msg.lower() or "shape" in msg.lower():
            raise ValueError(f"weights in {weights} do not match {os.path.join(folder, 'config.json')}: {msg[:500]}") from e
        raise ValueError(f"could not load {folder!r} as {cls.__name__}: {msg[:500]}") from e
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        items = list(info.get(key) or [])
        if key == "missing_keys":
            items = [i for i in items if not str(i).startswith(tuple(allow_missing))]
        if items:
            shown = ", ".join(str(i) for i in items[:5]) + (" ..." if len(items) > 5 else "")
            problems.append(f"{key.replace('_', ' ')} ({len(items)}): {shown}")
    if problems:
        raise ValueError(f"weights in {weights} do not match {os.path.join(folder, 'config.json')}: "
                         + "; ".join(problems))
    if device_map is None:
        model = model.to(device)
    return model.eval()


def load_tokenizer(folder: str):
    """The folder's tokenizer, local files only; a missing file is a ValueError naming it."""
    require_file(folder, "tokenizer_config.json", what="tokenizer")
    require_file(folder, "tokenizer.json", "tokenizer.model", "vocab.json", what="tokenizer")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"could not load the tokenizer of {folder!r} (tokenizer.json / tokenizer_config.json): {e}") from e


def to_pil(images: torch.Tensor):
    """[B, H, W, 3] in [-1, 1] -> list of PIL images."""
    from PIL import Image

    x = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
    return [Image.fromarray(a) for a in x]


# ----------------------------------------------------------------------------------------------
# the per-row static KV cache
# ----------------------------------------------------------------------------------------------
class SlotLayer(CacheLayerMixin):
    """Static keys/values ``[R, H, S, hd]`` of one layer; ``update`` writes at ``cache.slots``."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "SlotCache"):
        super().__init__()
        self.owner = owner
        self.is_initialized = False  # transformers 4.56's CacheLayerMixin does not set it

    def lazy_initialization(self, key_states, value_states):
        R, H, _, hd = key_states.shape
        S = self.owner.capacity
        self.keys = key_states.new_zeros(R, H, S, hd)
        self.values = value_states.new_zeros(R, H, S, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.slots_on(key_states.device)  # [R, T]
        rows = self.owner.rows_on(key_states.device)  # [R, 1]
        # [R, H, S, hd] viewed as [R, S, H, hd]: row r's node t goes to slot slots[r, t]
        self.keys.permute(0, 2, 1, 3)[rows, slots] = key_states.permute(0, 2, 1, 3).to(self.keys.dtype)
        self.values.permute(0, 2, 1, 3)[rows, slots] = value_states.permute(0, 2, 1, 3).to(self.values.dtype)
        return self.keys, self.values

    def get_mask_sizes(self, query_length):
        return self.owner.capacity, 0

    def get_seq_length(self):
        return 0  # positions always come from explicit position_ids

    def get_max_length(self):
        return self.owner.capacity

    def get_max_cache_shape(self):  # abstract in transformers 4.5x's CacheLayerMixin
        return self.owner.capacity

    def gather(self, rows, dst, src):
        for c in (self.keys, self.values):
            if c is None:
                continue
            v = c.permute(0, 2, 1, 3)
            d = c.device
            v[rows.to(d), dst.to(d)] = v[rows.to(d), src.to(d)]


class SlotCache(Cache):
    """A transformers ``Cache`` over preallocated per-row slots (see the module docstring)."""

    def __init__(self, num_layers: int, rows: int, capacity: int):
        self.capacity = capacity
        self.n_rows = rows
        self.slots = None
        self._dev_cache = {}
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def set_slots(self, slots: torch.Tensor):
        self.slots = slots
        self._dev_cache = {slots.device: (slots, torch.arange(slots.shape[0], device=slots.device)[:, None])}

    def _on(self, device):
        if device not in self._dev_cache:
            s = self.slots.to(device)
            self._dev_cache[device] = (s, torch.arange(s.shape[0], device=device)[:, None])
        return self._dev_cache[device]

    def slots_on(self, device):
        return self._on(device)[0]

    def rows_on(self, device):
        return self._on(device)[1]

    def gather(self, rows, dst, src):
        for layer in self.layers:
            layer.gather(rows, dst, src)

    # transformers queries these on some code paths; a slot cache has no single "length"
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.capacity


# ----------------------------------------------------------------------------------------------
# the adapter base: the transformers decoder stack behind SlotCacheModel
# ----------------------------------------------------------------------------------------------
class HFImageModel(SlotCacheModel):
    """`SlotCacheModel` over a transformers decoder stack.

    Subclasses set ``self.model`` (the transformers model), ``self.backbone`` (the decoder stack:
    takes inputs_embeds, attention_mask, position_ids, past_key_values), ``self.geometry``,
    ``self._num_layers``, ``max_positions`` and implement ``_prompt_embeds(ids [R, P])``,
    ``_draft_embeds(engine ids [R, T])`` and ``_image_logits(hidden [R, T, D]) -> [R, T, V]``
    (image codes only).
    """

    backbone: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def hidden_size(self) -> int:
        return int(self._embed.weight.shape[1])

    def torch_module(self):
        return self.model

    def _load_transformers_model(self, cls, folder: str, device_map=None, max_memory=None, offload_folder=None,
                                 attn_implementation=None):
        """`load_pretrained` into ``self.model`` (with accelerate's device_map, the input embeddings'
        device becomes the model's device); returns the model's config."""
        self.model = load_pretrained(cls, folder, self._device, self._dtype, device_map=device_map,
                                     max_memory=max_memory, offload_folder=offload_folder,
                                     attn_implementation=attn_implementation)
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
        raise NotImplementedError

    def _draft_embeds(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # SlotCacheModel hooks ----------------------------------------------------------------------
    def _new_cache(self, rows: int, capacity: int):
        return SlotCache(self._num_layers, rows, capacity)

    def _embed_prompt(self, ids):
        return self._prompt_embeds(ids)

    def embed_tokens(self, tokens):
        return self._draft_embeds(tokens)

    def image_logits(self, hidden):
        return self._image_logits(hidden)

    def _gather(self, cache, rows, dst, src):
        cache.gather(rows, dst, src)

    def _run(self, embeds, positions, allowed, cache: SlotCache, slots):
        """One pass of the decoder stack; `allowed` [R, T, S] bool -> float additive mask."""
        mask = torch.zeros(allowed.shape, dtype=embeds.dtype, device=embeds.device)
        mask.masked_fill_(~allowed, torch.finfo(embeds.dtype).min)
        cache.set_slots(slots)
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask[:, None], position_ids=positions,
                            past_key_values=cache, use_cache=True)
        return out.last_hidden_state


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

    def _prompt_embeds(self, ids):
        return self._embed(ids.to(self._embed.weight.device))

    def _draft_embeds(self, tokens):
        return self._embed(self._engine_to_model[tokens.to(self._engine_to_model.device)])

    def _image_logits(self, hidden):
        return hidden.to(self._head_rows.device) @ self._head_rows.T
