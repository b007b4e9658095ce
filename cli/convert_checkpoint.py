"""`python -m specar convert-checkpoint SRC DST`: a released .pt/.ckpt checkpoint (loaded with
weights_only=True: no code in the file runs) -> a safetensors file with the same tensors. The
conversion itself lives in model_loaders/checkpoints.py, next to the loaders that read those files."""
from __future__ import annotations

import os

from .args import parse_command


def add_arguments(ap) -> None:
    ap.add_argument("src", help="the .pt / .ckpt / .pth checkpoint")
    ap.add_argument("dst", help="the .safetensors file to write")


def run(args) -> None:
    from ..model_loaders.checkpoints import convert_checkpoint
    if not os.path.isfile(args.src):
        raise ValueError(f"{args.src!r} is not a file")
    if not args.dst.endswith(".safetensors"):
        raise ValueError(f"the output must be a .safetensors file, got {args.dst!r}")
    n = convert_checkpoint(args.src, args.dst)
    print(f"wrote {n} tensors to {args.dst}")


def main(argv=None):
    run(parse_command("convert-checkpoint", __doc__, add_arguments, argv))
