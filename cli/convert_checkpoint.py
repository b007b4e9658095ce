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
    with open(args.src, "rb") as f:  # torch.save writes a zip archive (PK), older torch a pickle (protocol >= 2)
        if f.read(2) not in (b"PK", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
            raise ValueError(f"{args.src} is not a torch checkpoint (neither the zip archive torch.save writes nor a "
                             f"pickle): give the released .pt / .ckpt file")
    if not args.dst.endswith(".safetensors"):
        raise ValueError(f"the output must be a .safetensors file, got {args.dst!r}")
    from ..model_loaders.files.checkpoints import convert_checkpoint
    n = convert_checkpoint(args.src, args.dst)
    print(f"wrote {n} tensors to {args.dst}")
    return n
