"""`python -m specar convert-drafter --kind lantern <folder> --model <model folder> [--out DIR]`: a released
drafter (LANTERN's Anole / LlamaGen EAGLE drafters) -> SpecAR's drafter.json + drafter.safetensors, bound to
the model's weight fingerprint. The conversion lives in samplers/drafters/eagle/lantern_conversion.py."""
from __future__ import annotations

import argparse

from ..model_loaders.registry import load_model
from ..samplers.drafters.eagle.lantern_conversion import convert_lantern_drafter


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m specar convert-drafter",
                                 description="convert a released drafter to SpecAR's drafter files")
    ap.add_argument("folder", help="the released drafter's folder (LANTERN: config.json + pytorch_model.bin "
                                   "or model.safetensors)")
    ap.add_argument("--kind", required=True, choices=["lantern"])
    ap.add_argument("--model", required=True, help="the target model's folder (as for load_model)")
    ap.add_argument("--out", default=None, help="output folder (default: <model folder>/eagle_drafter)")
    ap.add_argument("--attn-band", "--window", dest="attn_band", type=int, default=None,
                    help="positions the drafter attends to (default: 2 image rows; LANTERN attends to all; "
                         "--window: the older name)")
    ap.add_argument("--layout", default=None, help="model option: Chameleon layout (Anole: anole)")
    ap.add_argument("--n-head", type=int, default=None, help="model option: LlamaGen heads (non-standard widths)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    args = ap.parse_args(argv)
    opts = {k: v for k, v in (("layout", args.layout), ("n_head", args.n_head), ("device", args.device),
                              ("dtype", args.dtype)) if v}
    model = load_model(args.model, **opts)
    out = convert_lantern_drafter(args.folder, model, args.out, args.attn_band)
    print(f"wrote {out} (drafter.json, drafter.safetensors); use it with backend adt_tree "
          f"(drafter={out!r} unless it is <model folder>/eagle_drafter)")
