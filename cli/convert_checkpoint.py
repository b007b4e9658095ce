"""`python -m specar convert-checkpoint`: a released .pt/.ckpt checkpoint (loaded with weights_only=True) ->
safetensors.

A checkpoint that holds pickled objects beyond tensors and plain containers is refused, naming what it holds."""
from __future__ import annotations

import os


def add_arguments(ap) -> None:
    ap.add_argument("src", help="the released .pt / .ckpt file")
    ap.add_argument("dst", help="the .safetensors file to write")


def run(args) -> int:
    if not os.path.isfile(args.src):
        raise ValueError(f"checkpoint file {args.src} is missing (the released .pt / .ckpt file)")
    if not args.dst.endswith(".safetensors"):
        raise ValueError(f"the output must be a .safetensors file, got {args.dst!r}")
    from ..model_loaders.files.checkpoints import convert_checkpoint
    n = convert_checkpoint(args.src, args.dst)
    print(f"wrote {n} tensors to {args.dst}")
    return n
