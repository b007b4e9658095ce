"""`python -m specar.tooling memory`: the GPU memory a released checkpoint needs, computed (not measured) from its
published configuration: parameters, weights in bf16 / int8 / int4, the KV cache of one image at the default
backend's window and at window 64, and which weights fit a 8 / 12 / 16 / 24 GiB card, every size in GiB (2^30
bytes: what a card's "24 GB" means), in the code and in the table alike.

Parameters (`Checkpoint`): per decoder layer the attention's q, o (hidden^2 each) and k, v (hidden x kv width
each) and the MLP's three matrices (hidden x intermediate): what `quantize` converts, with LlamaGen's output head
(named `output`). Kept in bf16: the input embedding and the text `lm_head` (quantize skips `lm_head`; Lumina-mGPT
2.0 keeps only its 16384 image rows). Norms and the image tokenizer are left out (under 3% of a 7B model); so is
Janus-Pro's vision encoder. GLM-Image's two stages are counted exactly instead (`counted`): the AR stage's
parameters from transformers' `GlmImageForConditionalGeneration(GlmImageConfig())` on the meta device (its vision
encoder included), the DiT decoder's from diffusers' `GlmImageTransformer2DModel` with the released
transformer/config.json (hidden 32 x 128, 30 layers) plus its glyph encoder (ByT5-small's shape, which its
text_embed_dim 1472 matches) and its 16-channel VAE, all three loaded unquantized when the first image is decoded;
tooling/tests/test_memory.py recounts them where those libraries are installed. Its
third row is the whole image: one decode holds both stages, the AR stage quantized or not and the DiT in bf16.
int8: one byte per converted weight and a bf16 scale per output channel; int4: half a byte per weight and a bf16
scale per group of 128 (model_loaders/precision/quantize.py). The DiT runs in diffusers: SpecAR does not quantize it.

KV cache (bf16): 2 (keys, values) x layers x kv width x 2 bytes per slot and row, for the image's positions (its
grid, row ends included; GLM-Image: the preview grid and the target grid; the prompt left out) plus the draft
slots of `auto` at that window (the pending token, the window's drafts, their row ends and auto's proactive
branches, as samplers/drafters/jacobi sizes them), x2 rows with CFG (GLM-Image's AR stage has no CFG).

Fits: the smallest weights (bf16, int8, int4) whose weights + KV at window 64 + `ALLOWANCE_GIB` (activations, the
image tokenizer, CUDA's own context: assumed, not measured) fit a card of N GiB; "-" where none does (then only
`offload auto`, which does not combine with `quantize`, runs it: model_loaders/files/hf_files.py).
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Optional

CARDS_GIB = (8, 12, 16, 24)
ALLOWANCE_GIB = 1.5  # activations, image tokenizer, CUDA context: an assumption until measured
WIDE_WINDOW = 64
INT4_GROUP = 128  # quantize.GROUP_SIZE
GIB = 2 ** 30


@dataclass(frozen=True)
class Checkpoint:
    name: str
    checkpoint: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    image_px: int
    grid: int  # image tokens per side at the default size
    row_end: bool  # a forced row-end token after each row
    cfg: bool = True
    ffn: int = 0
    embed_rows: int = 0  # input embedding rows (bf16)
    head_rows: int = 0  # output head rows
    head_quantized: bool = False  # LlamaGen's `output`; the text lm_head stays bf16
    preview_grid: int = 0  # GLM-Image: the preview grid sampled first
    counted: Optional[tuple] = None  # (parameters, of them converted by quantize, their output channels, int4 groups)
    decoder_only: bool = False  # no KV cache (the DiT)
    note: str = ""
    head_dim: int = 0  # an explicit head width (Emu3.5: 128 on a 5120 width of 64 heads); 0: hidden / heads

    def widths(self) -> tuple:
        """(query width, key/value width): heads and kv heads times the head width."""
        hd = self.head_dim or self.hidden // self.heads
        return self.heads * hd, self.kv_heads * hd

    def parameters(self) -> tuple:
        """(all parameters, those quantize converts, their output channels, their int4 groups)."""
        if self.counted:
            return self.counted
        h, (qw, kv) = self.hidden, self.widths()
        q = self.layers * (2 * h * qw + 2 * h * kv + 3 * h * self.ffn)
        channels = self.layers * (qw + 2 * h + 2 * kv + 2 * self.ffn)  # q: qw; o, down: h; k, v: kv; gate, up: ffn
        head = self.head_rows * h
        if self.head_quantized:
            q, channels = q + head, channels + self.head_rows
        # every input width here is a multiple of 128: one int4 group per 128 weights
        return q + self.embed_rows * h + (0 if self.head_quantized else head), q, channels, q // INT4_GROUP

    def positions(self) -> int:
        return self.grid * (self.grid + int(self.row_end)) + self.preview_grid ** 2


def _from_specs() -> list:
    from .released_models import RELEASED
    from .real_size_builders import SPECS
    d = SPECS["llamagen-xl"].dims
    rows = [Checkpoint("llamagen-xl", SPECS["llamagen-xl"].checkpoint, 36, d["dim"], d["heads"], d["heads"], 384, 24,
                       False, ffn=d["ffn"], embed_rows=d["codes"] + d["classes"], head_rows=d["codes"],
                       head_quantized=True, note="class-conditional")]
    for name, px_per_code, row_end, spec in (
            ("janus-pro-1b", 16, False, SPECS["janus-pro-1b"]), ("janus-pro-7b", 16, False, RELEASED["janus-pro-7b"].spec),
            ("emu3-gen", 8, True, SPECS["emu3-gen"]), ("lumina-mgpt-7b", 16, True, SPECS["lumina-mgpt-7b"]),
            ("lumina-mgpt-2", 8, True, RELEASED["lumina-mgpt-2-7b"].spec), ("anole-7b", 16, False, SPECS["anole-7b"])):
        d = spec.dims
        head = d["codes"] if spec.family == "lumina2" else d["vocab"]  # Lumina-mGPT 2.0 keeps the image rows only
        rows.append(Checkpoint(name, spec.checkpoint, spec.layers, d["hidden"], d["heads"], d["kv"], d["image"],
                               d["image"] // px_per_code, row_end, ffn=d["ffn"], embed_rows=d["vocab"], head_rows=head,
                               note=RELEASED["lumina-mgpt-2-7b"].assumed if spec.family == "lumina2" else ""))
    e = RELEASED["emu3.5-image"]
    d = e.spec.dims
    rows.append(Checkpoint("emu3.5, emu3.5-image", "BAAI/Emu3.5, BAAI/Emu3.5-Image", e.spec.layers, d["hidden"],
                           d["heads"], d["kv"], d["image"], d["image"] // e.pixels_per_code, True, ffn=d["ffn"],
                           embed_rows=d["vocab"], head_rows=d["codes"], head_dim=d["head_dim"],
                           note="one architecture, two checkpoints; " + e.assumed))
    return rows


def checkpoints() -> list:
    """Every released checkpoint a user runs, in the order of the table."""
    glm = [Checkpoint("glm-image-ar", "zai-org/GLM-Image vision_language_encoder", 40, 4096, 32, 2, 1024, 32, False,
                      cfg=False, preview_grid=16, counted=GLM_AR_COUNT, note="AR stage; the DiT decodes after it"),
           Checkpoint("glm-image-dit", "zai-org/GLM-Image transformer", 30, 4096, 32, 32, 1024, 0, False, cfg=False,
                      counted=(GLM_DIT_COUNT[0] + GLM_GLYPH_ENCODER + GLM_VAE, 0, 0, 0), decoder_only=True,
                      note="the DiT decoder: DiT, glyph encoder, VAE (diffusers; not quantized by SpecAR)")]
    whole = (GLM_AR_COUNT[0] + glm[1].counted[0],) + GLM_AR_COUNT[1:]  # the decoder's weights kept in bf16
    glm.append(dataclasses.replace(glm[0], name="glm-image AR + DiT", counted=whole,
                                   note="the whole image: the AR stage (bf16 / int8 / int4) and the DiT in bf16"))
    return _from_specs() + glm


# counted on the meta device (module docstring): transformers 5.24 / diffusers 0.42.1, 2026-11-28
GLM_AR_COUNT = (10114245632, 9290383360, 2160640, 72581120)
GLM_DIT_COUNT = (6926882880, 0, 0, 0)
GLM_GLYPH_ENCODER, GLM_VAE = 217657472, 83821011


def draft_slots(window: int, grid: int, row_end: bool) -> int:
    """KV slots `auto` reserves past the image at `max_window=window` (JacobiDrafter's node budget + 1)."""
    from ..samplers.drafters.auto import AutoParams
    p = AutoParams(max_window=window)
    chain = 1 + window + (window // grid if row_end and grid else 0)
    branches = (p.tree_width - 1) * p.tree_depth if p.tree_depth <= window else 0
    return chain + branches + 1


def memory_row(c: Checkpoint) -> dict:
    from ..samplers.drafters.auto import AutoParams
    total, q, channels, groups = c.parameters()
    kept = total - q
    weights = {"bf16": 2 * total / GIB, "int8": (q + 2 * channels + 2 * kept) / GIB,
               "int4": (q / 2 + 2 * groups + 2 * kept) / GIB}
    if not q:
        weights["int8"] = weights["int4"] = None
    row = {"model": c.name, "checkpoint": c.checkpoint, "parameters": total, "quantized_parameters": q,
           "bf16_gib": weights["bf16"], "int8_gib": weights["int8"], "int4_gib": weights["int4"],
           "image_px": c.image_px, "image_tokens": c.grid * c.grid, "positions": c.positions(),
           "cfg_rows": 2 if c.cfg else 1, "note": c.note}
    if c.decoder_only:
        row.update(kv_mb_per_token=None, kv_gib={}, fits={})
    else:
        per_slot = 2 * c.layers * c.widths()[1] * 2 * row["cfg_rows"]
        default = AutoParams().max_window
        row["kv_mb_per_token"] = per_slot / 1e6
        row["kv_gib"] = {str(w): per_slot * (c.positions() + draft_slots(w, c.grid, c.row_end)) / GIB
                        for w in (default, WIDE_WINDOW)}
        need = row["kv_gib"][str(WIDE_WINDOW)] + ALLOWANCE_GIB
    if c.decoder_only:
        need = ALLOWANCE_GIB
    row["fits"] = {str(card): next((w for w in ("bf16", "int8", "int4") if weights[w] is not None
                                    and weights[w] + need <= card), None) for card in CARDS_GIB}
    return row


def add_arguments(ap) -> None:
    ap.add_argument("--json", help="write the table to this file")


def run(args):
    from ..samplers.drafters.auto import AutoParams
    rows = [memory_row(c) for c in checkpoints()]
    default = AutoParams().max_window
    data = {"meta": {"command": args.command_line, "date": time.strftime("%Y-%m-%d"), "computed": True,
                     "default_window": default, "wide_window": WIDE_WINDOW, "allowance_gib": ALLOWANCE_GIB,
                     "cards_gib": list(CARDS_GIB)}, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(f"computed from published configurations, not measured; KV: auto at window {default} / {WIDE_WINDOW}; "
          f"fits: weights + KV at window {WIDE_WINDOW} + {ALLOWANCE_GIB} GiB assumed for the rest")
    for r in rows:
        w = " / ".join("-" if r[k] is None else f"{r[k]:.1f}" for k in ("bf16_gib", "int8_gib", "int4_gib"))
        kv = " / ".join(f"{v:.2f}" for v in r["kv_gib"].values()) or "-"
        fits = " / ".join(r["fits"][str(c)] or "-" for c in CARDS_GIB)
        print(f"{r['model']:14s} {r['parameters'] / 1e9:6.2f} B  weights bf16/int8/int4 {w:>16s} GiB  "
              f"KV {kv:>11s} GiB  fits {'/'.join(map(str, CARDS_GIB))} GiB: {fits}")
    return data


__all__ = ["ALLOWANCE_GIB", "CARDS_GIB", "Checkpoint", "add_arguments", "checkpoints", "draft_slots", "memory_row",
           "run"]
