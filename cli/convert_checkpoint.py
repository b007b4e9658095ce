"""`python -m specar convert-checkpoint`: a released .pt/.ckpt checkpoint (loaded with weights_only=True) ->
safetensors.

The conversion lives in model_loaders/files/checkpoints.py, next to the loaders that read those files."""
from __future__ import annotations


def add_arguments(ap) -> None:
    ap.add_argument("src", help="the released .pt / .ckpt file")
    ap.add_argument("dst", help="the .safetensors file to write")


def run(args) -> int:
    from ..model_loaders.files.checkpoints import convert_checkpoint
    n = convert_checkpoint(args.src, args.dst)
    print(f"wrote {n} tensors to {args.dst}")
    return n
