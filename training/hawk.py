"""Hawk head training by self-distillation: `python -m specar train-drafter --kind hawk`.

Data, loss (Medusa / Hawk, balance weight lambda_k = 1: the cross-entropy of the TARGET's own distribution at the
head's target position against the head's) and optimiser: docs/HAWK.md, "Training". feats[:, i] is the hidden state
h_{i-1} of position i - 1 (i = 0: the prompt's last token), whose target head output predicts position i:

    horizontal head k on h_{i-1}: target position i + k
    vertical head d   on h_{i-1}: target position i + d * row_stride

Only the heads train; the target is frozen."""
from __future__ import annotations

import os
import time

import torch

from ..model_loaders.files.drafter_files import save_drafter
from ..samplers.drafters.hawk.network import HawkConfig, HawkHeads
from ..samplers.target import SamplingParams, guided_logits, target_probs
from .loop import train
from .selfdistill import start_head_training

DEFAULTS = {"per_prompt": 8, "horizontal_heads": 6, "vertical_depth": 2, "positions": 16}


def head_offsets(cfg: HawkConfig, stride: int) -> list:
    """Target offset (from position i, the one h_{i-1} predicts) of every head, horizontal first."""
    return [k for k in range(1, cfg.horizontal_heads + 1)] + [d * stride for d in range(1, cfg.vertical_depth + 1)]


def hawk_loss(heads: HawkHeads, model, fc, fu, starts, sampling: SamplingParams, forced, stride: int):
    """fc, fu [R, n, D] (fu None without CFG); starts [R, P] positions i (inputs h_{i-1}).
    Returns (loss, per-head cross-entropy [H])."""
    R, n, D = fc.shape
    cfg = heads.cfg
    offs = head_offsets(cfg, stride)
    nh = cfg.horizontal_heads
    rows = torch.arange(R, device=fc.device)[:, None]
    dtype = model.embed_tokens(torch.zeros(1, dtype=torch.long, device=fc.device)).dtype
    branches = [fc] if fu is None else [fc, fu]
    x = [b[rows, starts] for b in branches]  # [R, P, D]
    g_h = [heads.horizontal(h) for h in x]  # [R, P, nh, D]
    losses = []
    for hi, off in enumerate(offs):
        tpos = starts + off
        ok = (tpos < n) & ~forced[tpos.clamp(max=n - 1)]
        tposc = tpos.clamp(max=n - 1)
        with torch.no_grad():
            tl = [model.image_logits(b[rows, tposc].to(dtype)).float() for b in branches]
            p = target_probs(tl[0], tl[1] if fu is not None else None, sampling)
        if hi < nh:
            g = [gh[:, :, hi] for gh in g_h]
        else:
            d = hi - nh
            g = [h + torch.nn.functional.silu(h @ heads.v_weight[d].T + heads.v_bias[d]) for h in x]
        hl = [model.image_logits(gg.to(dtype)).float() for gg in g]
        logq = torch.log_softmax(guided_logits(hl[0], hl[1] if fu is not None else None, sampling.cfg_scale), -1)
        ce = -(p * logq.clamp(min=-1e4)).sum(-1)
        losses.append((ce * ok).sum() / ok.sum().clamp(min=1))
    per_head = torch.stack(losses)
    return per_head.sum(), per_head


def train_hawk(model, args):
    fc, fu, t_data, t_start, sampling = start_head_training(model, args, DEFAULTS)
    dev = model.device
    cfg = HawkConfig(model.hidden_size, args.horizontal_heads, args.vertical_depth)
    heads = HawkHeads(cfg).to(dev)
    n = fc.shape[1]
    # forced[i]: position i is a structure token (feats index i predicts position i): no loss there
    forced = (model.geometry.forced_tokens() >= 0).to(dev)
    stride = model.geometry.row_stride
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    R = fc.shape[0]

    def loss_fn(step):
        idx = torch.randint(R, (min(args.batch, R),), generator=g)
        starts = torch.randint(n - 1, (idx.shape[0], args.positions), generator=g).to(dev)
        idx = idx.to(dev)
        loss, per = hawk_loss(heads, model, fc[idx], None if fu is None else fu[idx], starts, sampling, forced,
                              stride)
        return loss

    os.makedirs(args.out, exist_ok=True)
    record = train(heads, loss_fn, args.steps, args.out, args.lr, weight_decay=0.1, betas=(0.9, 0.95),
                    resume=args.resume, schedule=getattr(args, "lr_schedule", "constant"))
    # evaluation on a fixed slice of the data: per-head cross-entropy and top-1 agreement
    with torch.no_grad():
        idx = torch.arange(min(R, 16), device=dev)
        starts = torch.arange(0, n - 1, device=dev).expand(idx.shape[0], n - 1)
        loss, per = hawk_loss(heads, model, fc[idx], None if fu is None else fu[idx], starts, sampling, forced, stride)
        zero = HawkHeads(cfg).to(dev)
        _, per0 = hawk_loss(zero, model, fc[idx], None if fu is None else fu[idx], starts, sampling, forced, stride)
    names = [f"h{k}" for k in range(1, cfg.horizontal_heads + 1)] + [f"v{d}" for d in range(1, cfg.vertical_depth + 1)]
    training = {"time_s": round(time.perf_counter() - t_start, 1), "data_s": round(t_data, 1),
                "train_s": round(record["seconds"], 1), "steps": args.steps, "loss": record["final_loss"],
                "eval_ce": {k: round(float(v), 4) for k, v in zip(names, per)},
                "eval_ce_untrained": {k: round(float(v), 4) for k, v in zip(names, per0)},
                "images": int(fc.shape[0]), "batch": args.batch, "positions": args.positions, "lr": args.lr,
                "lr_schedule": record["schedule"], "resumed_from": record["resumed_from"], "seed": args.seed,
                "threads": torch.get_num_threads()}
    save_drafter(args.out, "hawk", model, heads.state_dict(), cfg.to_dict(), training=training)
    print(f"saved {args.out}: {training}")
    return heads
