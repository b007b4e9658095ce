"""`python -m specar convert-drafter`: a released drafter (LANTERN's Anole / LlamaGen EAGLE drafters) -> SpecAR's
drafter.json + drafter.safetensors, bound to the model's weight fingerprint.

The converted drafter runs with the adt_tree backend (its EAGLE drafter)."""
from __future__ import annotations

import os

from .args import positive_int


def add_arguments(ap) -> None:
    ap.add_argument("folder", help="the released drafter's folder (LANTERN: config.json + pytorch_model.bin "
                                   "or model.safetensors)")
    ap.add_argument("--kind", required=True, choices=["lantern"], help="the released drafter's format")
    ap.add_argument("--model", required=True, help="the target model's folder (as for load_model)")
    ap.add_argument("--out", default=None, help="output folder (unset: <model folder>/eagle_drafter)")
    ap.add_argument("--attn-band", "--window", dest="attn_band", type=positive_int, default=None,
                    help="positions the drafter attends to (unset: 2 image rows; LANTERN attends to all; "
                         "--window: the older name)")
    ap.add_argument("--layout", default=None, help="model option: Chameleon layout (Anole: anole)")
    ap.add_argument("--n-head", type=positive_int, default=None, help="model option: LlamaGen heads (non-standard "
                    "widths)")
    ap.add_argument("--device", default=None, help="model option: cpu, cuda, cuda:N")
    ap.add_argument("--dtype", default=None, help="model option: the weights' precision")


def run(args) -> str:
    if not os.path.isdir(args.folder):
        raise ValueError(f"no such drafter folder {args.folder!r} (LANTERN's: config.json + weights)")
    from ..model_loaders.registry import load_model
    from ..samplers.backends import METHODS
    from ..samplers.drafters.eagle.lantern_conversion import convert_lantern_drafter
    opts = {k: v for k, v in (("layout", args.layout), ("n_head", args.n_head), ("device", args.device),
                              ("dtype", args.dtype)) if v}
    model = load_model(args.model, **opts)
    out = convert_lantern_drafter(args.folder, model, args.out, args.attn_band)
    backend = next(m.name for m in METHODS if m.drafter_kind == "eagle")  # the backend that runs EAGLE drafters
    print(f"wrote {out} (drafter.json, drafter.safetensors); use it with backend {backend} "
          f"(drafter={out!r} unless it is <model folder>/eagle_drafter)")
    return out
