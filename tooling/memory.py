"""`python -m specar.tooling memory`: the memory a released checkpoint needs, computed (not measured) from its
published configuration (real_size_builders.SPECS): parameters, weights in bf16 / int8 / int4, and the KV cache of
one image with CFG (2 rows) in bf16.

Parameters: per decoder layer the attention's q, o (hidden^2 each) and k, v (hidden x hidden x kv/heads each) and
the MLP's three matrices (hidden x intermediate), plus the input embedding and the output head (vocabulary x
hidden each; LlamaGen: its codes and class embeddings). Norms, the image tokenizer and the vision encoder are left
out (under 3% of a 7B model). int8 / int4: one byte / half a byte per weight of the decoder's linear layers (what
`quantize` converts), embeddings kept in bf16. KV: 2 (keys, values) x layers x hidden x kv/heads x 2 bytes per
token and row, for the image's tokens (its grid, the prompt left out) and 2 rows.
"""
from __future__ import annotations

import json
import time

from .real_size_builders import SPECS


def add_arguments(ap) -> None:
    ap.add_argument("--json", help="write the table to this file")


def _dims(spec) -> dict:
    d = spec.dims
    if spec.family == "llamagen":  # LlamaGen's names; its vocabulary is the codes, plus class embeddings
        h, f = d["dim"], d["ffn"]
        return dict(hidden=h, heads=d["heads"], kv=d["heads"], ffn=f, embed=d["codes"] + d["classes"],
                    head=d["codes"], downsample=2 ** (len(d["vq_mult"]) - 1), image=d["image"])
    return dict(hidden=d["hidden"], heads=d["heads"], kv=d["kv"], ffn=d["ffn"], embed=d["vocab"], head=d["vocab"],
                downsample=2 ** (len((d.get("vq_mult") or ())) - 1), image=d["image"])


def memory_row(name: str) -> dict:
    spec = SPECS[name]
    d, L = _dims(spec), spec.layers
    h, kv_dim = d["hidden"], d["hidden"] * d["kv"] // d["heads"]
    linear = L * (2 * h * h + 2 * h * kv_dim + 3 * h * d["ffn"]) + d["head"] * h  # what quantize converts
    embed = d["embed"] * h
    grid = d["image"] // d["downsample"]
    image_tokens = grid * grid
    kv_per_token = 2 * L * kv_dim * 2 * 2  # keys and values, bf16, 2 rows (CFG)
    gb = 1e9
    return {"model": name, "checkpoint": spec.checkpoint, "parameters": linear + embed,
            "bf16_gb": 2 * (linear + embed) / gb, "int8_gb": (linear + 2 * embed) / gb,
            "int4_gb": (linear / 2 + 2 * embed) / gb, "image_px": d["image"], "image_tokens": image_tokens,
            "kv_mb_per_token_cfg": kv_per_token / 1e6, "kv_gb_per_image_cfg": kv_per_token * image_tokens / gb}


def run(args):
    rows = [memory_row(name) for name in SPECS]
    data = {"meta": {"command": args.command_line, "date": time.strftime("%Y-%m-%d"), "computed": True}, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    for r in rows:
        print(f"{r['model']:16s} {r['parameters'] / 1e9:6.2f} B  bf16 {r['bf16_gb']:5.1f} GB  int8 {r['int8_gb']:5.1f} "
              f"GB  int4 {r['int4_gb']:5.1f} GB  KV/image (CFG) {r['kv_gb_per_image_cfg']:5.2f} GB")
    return data


__all__ = ["add_arguments", "memory_row", "run"]
