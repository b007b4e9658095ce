"""`python -m specar train-drafter`: train a backend's drafter on a frozen model by self-distillation.

The kinds (`--kind`) are the registered methods' drafters: hawk (Hawk's heads), eagle (an EAGLE layer, for
ADT-Tree) and spatial (the spatial heads)."""
from __future__ import annotations

import importlib
import os

from . import schema
from .args import non_negative_float, non_negative_int, positive_float, positive_int

# kind -> "module:function" under training/ (the registry's Method.drafter_kind / Method.train)
KINDS = {kind: m.train for kind, m in schema.drafter_kinds().items()}


def add_arguments(ap) -> None:
    ap.add_argument("--kind", required=True, choices=sorted(KINDS), help="the drafter: " + "; ".join(
        f"{kind}: {m.label}'s (backend {m.name})" for kind, m in schema.drafter_kinds().items()))
    ap.add_argument("--model", default="demo", help="demo, or a model folder")
    ap.add_argument("--out", required=True, help="output folder (drafter.safetensors, drafter.json, checkpoint/)")
    ap.add_argument("--prompts", default=None,
                    help="text file, one prompt per line (unset, for demo: its data generator)")
    ap.add_argument("--images", type=positive_int, default=512, help="images the target samples for distillation")
    ap.add_argument("--steps", type=non_negative_int, default=2000,
                    help="optimiser steps (0: write the initial drafter, e.g. --init's, with its evaluation)")
    ap.add_argument("--batch", type=positive_int, default=32, help="training rows per step")
    ap.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate")
    ap.add_argument("--attn-band", "--window", dest="attn_band", type=positive_int, default=None,
                    help="eagle: committed positions the layer attends to (unset: 2 image rows; --window: the "
                         "older name)")
    ap.add_argument("--intermediate-size", type=non_negative_int, default=0,
                    help="eagle: the layer's MLP width (0: the llama default for the hidden size)")
    ap.add_argument("--lr-schedule", default="constant", choices=["constant", "cosine"],
                    help="constant, or cosine from --lr to 0 over --steps (a function of the global step: "
                         "--resume with cosine continues a constant run into a decay)")
    ap.add_argument("--init", default=None,
                    help="eagle: start from this drafter folder's weights (fine-tuning; its attention band and MLP width win)")
    ap.add_argument("--guided-weight", type=non_negative_float, default=0.0,
                    help="eagle: weight (>= 0) of KL(target || drafter) of the sampling distributions (CFG combined, "
                         "temperature, top-k), the distributions verification compares (0: off)")
    ap.add_argument("--seed", type=non_negative_int, default=0, help="random seed of sampling and training")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:N (unset: a GPU when there is one)")
    ap.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint")


def run(args) -> None:
    if args.prompts and not os.path.isfile(args.prompts):
        raise ValueError(f"--prompts: no such file {args.prompts!r} (one prompt per line)")
    if args.init and not os.path.isdir(args.init):
        raise ValueError(f"--init: no such drafter folder {args.init!r}")
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from ..model_loaders.registry import load_model
    model = load_model(args.model, device=args.device)
    module, fn = KINDS[args.kind].split(":")
    training = __package__.rpartition(".")[0] + ".training"  # the pack's own name, whatever its folder
    train = getattr(importlib.import_module(f".{module}", training), fn)
    train(model, args)
