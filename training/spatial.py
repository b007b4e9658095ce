"""Spatial-head training by self-distillation: `python -m specar train-drafter --kind spatial`. Data, loss (the total
variation between the target's p and the head's q) and optimiser: docs/SPATIAL.md, "Training" (why not Hawk's
cross-entropy: its "Which part comes from which paper"); feats[:, i] is h_{i-1}, the state predicting position i."""
from __future__ import annotations

import os
import time

import torch

from ..model_loaders.files.drafter_files import save_drafter
from ..samplers.drafters.spatial.network import KIND, TAPS, SpatialConfig, SpatialHeads
from ..samplers.target import SamplingParams, guided_logits, target_probs

DEFAULTS = {"per_prompt": 8, "head_depths": 2, "positions": 16, "taps": TAPS}


def head_taps(feats: torch.Tensor, rows: torch.Tensor, target: torch.Tensor, depth: int, stride: int,
              taps: tuple) -> torch.Tensor:
    """feats [R, n, D] (index i: h_{i-1}); target positions [R', P] -> taps [R', P, len(taps), D] of head
    `depth`: the states at A + taps, A = target - depth * stride (state of position j at index j + 1)."""
    a = target - depth * stride
    idx = torch.stack([a + 1 + t for t in taps], -1)  # [R', P, len(taps)]
    return feats[rows[:, :, None], idx]


def spatial_loss(heads: SpatialHeads, model, fc, fu, target, sampling: SamplingParams, forced, stride: int):
    """fc, fu [R, n, D] (fu None without CFG); target [R, P] positions (>= depths * stride).

    Returns (loss, per-depth total variation [depths], per-depth cross-entropy [depths]). The loss
    is the summed TV(p, q) = 1 - sum min(p, q), one minus the acceptance rate of a draft from q
    against p, with q = `target_probs` of the head's logits: exactly the q the drafter samples
    from (CFG, temperature, top-k). The cross-entropy of p against the CFG-guided head
    distribution (no top-k) is reported beside it."""
    R, n, D = fc.shape
    rows = torch.arange(R, device=fc.device)[:, None]
    dtype = model.embed_tokens(torch.zeros(1, dtype=torch.long, device=fc.device)).dtype
    branches = [fc] if fu is None else [fc, fu]
    ok = ~forced[target]
    with torch.no_grad():
        tl = [model.image_logits(b[rows, target].to(dtype)).float() for b in branches]
        p = target_probs(tl[0], tl[1] if fu is not None else None, sampling)
    tvs, ces = [], []
    for d in range(1, heads.cfg.depths + 1):
        hl = [model.image_logits(heads(head_taps(b, rows, target, d, stride, heads.cfg.taps), d).to(dtype)).float() for b in branches]
        uncond = hl[1] if fu is not None else None
        q = target_probs(hl[0], uncond, sampling)
        tv = 1.0 - torch.minimum(p, q).sum(-1)
        tvs.append((tv * ok).sum() / ok.sum().clamp(min=1))
        with torch.no_grad():
            logq = torch.log_softmax(guided_logits(hl[0], uncond, sampling.cfg_scale), -1)
            ces.append(((-(p * logq.clamp(min=-1e4)).sum(-1)) * ok).sum() / ok.sum().clamp(min=1))
    tvs = torch.stack(tvs)
    return tvs.sum(), tvs.detach(), torch.stack(ces)


def train_spatial(model, args):
    from .loop import train
    from .selfdistill import start_head_training
    fc, fu, t_data, t_start, sampling = start_head_training(model, args, DEFAULTS)
    dev = model.device
    cfg = SpatialConfig(model.hidden_size, args.head_depths, args.taps)
    heads = SpatialHeads(cfg).to(dev)
    R, n = fc.shape[:2]
    forced = (model.geometry.forced_tokens() >= 0).to(dev)
    stride = model.geometry.row_stride
    lo = cfg.depths * stride  # the first position every head can reach
    if lo >= n:
        raise ValueError(f"head_depths={cfg.depths} needs images of more than {cfg.depths} rows")
    g = torch.Generator(device="cpu").manual_seed(args.seed)

    def loss_fn(step):
        idx = torch.randint(R, (min(args.batch, R),), generator=g).to(dev)
        target = torch.randint(lo, n, (idx.shape[0], args.positions), generator=g).to(dev)
        return spatial_loss(heads, model, fc[idx], None if fu is None else fu[idx], target, sampling, forced,
                            stride)[0]

    os.makedirs(args.out, exist_ok=True)
    record = train(heads, loss_fn, args.steps, args.out, args.lr, weight_decay=0.1, betas=(0.9, 0.95),
                    resume=args.resume, schedule=getattr(args, "lr_schedule", "constant"))
    # evaluation on the first 16 sequences, every reachable position: per-depth cross-entropy
    with torch.no_grad():
        idx = torch.arange(min(R, 16), device=dev)
        target = torch.arange(lo, n, device=dev).expand(idx.shape[0], n - lo)
        args_eval = (model, fc[idx], None if fu is None else fu[idx], target, sampling, forced, stride)
        _, tv, ce = spatial_loss(heads, *args_eval)
        _, tv0, ce0 = spatial_loss(SpatialHeads(cfg).to(dev), *args_eval)
    names = [f"d{d}" for d in range(1, cfg.depths + 1)]
    training = {"time_s": round(time.perf_counter() - t_start, 1), "data_s": round(t_data, 1),
                "train_s": round(record["seconds"], 1), "steps": args.steps, "loss": record["final_loss"],
                "eval_tv": {k: round(float(v), 4) for k, v in zip(names, tv)},
                "eval_tv_untrained": {k: round(float(v), 4) for k, v in zip(names, tv0)},
                "eval_ce": {k: round(float(v), 4) for k, v in zip(names, ce)},
                "eval_ce_untrained": {k: round(float(v), 4) for k, v in zip(names, ce0)},
                "images": int(R), "batch": args.batch, "positions": args.positions, "lr": args.lr,
                "lr_schedule": record["schedule"], "resumed_from": record["resumed_from"], "seed": args.seed,
                "threads": torch.get_num_threads()}
    save_drafter(args.out, KIND, model, heads.state_dict(), cfg.to_dict(), training=training)
    print(f"saved {args.out}: {training}")
    return heads
