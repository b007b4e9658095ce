"""EAGLE drafter training by self-distillation: `python -m specar train-drafter --kind eagle`.

Data, loss and options: docs/ADT_TREE.md (the demo drafter's training). Both CFG branches are training rows (the
drafter runs both at inference); input features get uniform noise (EAGLE's +-0.1 scaled to the feature norm) so the
layer tolerates its own predicted features when it drafts several layers deep.

`guided_weight` > 0 adds KL(p || q) between the target's SAMPLING distribution p (`target_probs`) and the drafter's
guided distribution q (no top-k, so every code keeps a gradient): per-branch losses cannot see that CFG at scale s
multiplies the drafter's branch errors by s and s - 1 in the guided logits; this term does. A batch then holds
batch / 2 images, each as its conditional and its unconditional row.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

from ..model_loaders.files.drafter_files import save_drafter
from ..samplers.drafters.eagle.files import load_eagle
from ..samplers.drafters.eagle.network import EagleConfig, EagleNet
from ..samplers.target import guided_logits, target_probs
from .loop import fill_defaults, frozen_target_sampling, train
from .selfdistill import distill_features

CE_WEIGHT = 0.1
NOISE = 0.1


def collect(model, args, log=sys.stderr):
    """Features [R, n, D] (index j: the feature that predicted position j), tokens [R, n]: both CFG
    branches are training rows (same tokens)."""
    fc, fu, toks, secs = distill_features(model, args, log)
    if fu is None:
        return fc, toks, secs
    per = max(1, min(args.per_prompt, args.images))  # rows per prompt: cond then uncond, prompt by prompt
    R, n, D = fc.shape
    feats = torch.stack([fc.view(-1, per, n, D), fu.view(-1, per, n, D)], 1).reshape(2 * R, n, D)
    toks = torch.stack([toks.view(-1, per, n)] * 2, 1).reshape(2 * R, n)
    return feats, toks, secs


def guided_kl(target_logits: torch.Tensor, draft_logits: torch.Tensor, sampling) -> torch.Tensor:
    """Mean KL(p || q) of the sampling distributions: target / drafter image logits [2b, m, V], the
    first b rows conditional and the last b their unconditional twins (or [b, m, V] without CFG)."""
    b = target_logits.shape[0] // 2 if sampling.uses_cfg else target_logits.shape[0]

    def branches(lg):
        return (lg[:b], lg[b:]) if sampling.uses_cfg else (lg, None)
    with torch.no_grad():
        p = target_probs(*branches(target_logits), sampling)
    logq = torch.log_softmax(guided_logits(*branches(draft_logits), sampling.cfg_scale) / (sampling.temperature or 1.0),
                             -1)
    return (torch.xlogy(p, p) - p * logq).sum(-1).mean()


def eagle_loss(net: EagleNet, model, feats, toks, forced, noise: float = NOISE, guided_weight: float = 0.0,
               sampling=None):
    """feats [R, n, D] (j: feature predicting j), toks [R, n]: EAGLE loss on positions 0..n-2.
    With `guided_weight` the rows are paired as `guided_kl` reads them."""
    R, n, D = feats.shape
    x_f = feats[:, :-1]  # f_{j-1} for inputs j = 0..n-2
    if noise:
        x_f = x_f + (torch.rand_like(x_f) - 0.5) * 2 * noise * x_f.abs().mean()
    emb = model.embed_tokens(toks[:, :-1].to(model.device)).float()
    pos = torch.arange(n - 1, device=feats.device).expand(R, n - 1)
    mask = net.band_mask(n - 1, feats.device).expand(R, n - 1, n - 1)
    g = net(x_f, emb, pos, mask)
    target = feats[:, 1:]  # h_j: predicts j + 1
    keep = ~forced[1:]  # positions whose next token is sampled
    reg = F.smooth_l1_loss(g[:, keep], target[:, keep])
    head_dtype = model.embed_tokens(toks[:1, :1].to(model.device)).dtype
    with torch.no_grad():
        target_logits = model.image_logits(target[:, keep].to(head_dtype)).float()
    draft_logits = model.image_logits(g[:, keep].to(head_dtype)).float()
    ce = -(torch.softmax(target_logits, -1) * torch.log_softmax(draft_logits, -1)).sum(-1).mean()
    loss = reg + CE_WEIGHT * ce
    kl = guided_kl(target_logits, draft_logits, sampling) if sampling is not None else torch.zeros(())
    return loss + guided_weight * kl, reg, ce, kl


def paired_rows(images: torch.Tensor, per: int, uses_cfg: bool) -> torch.Tensor:
    """Row indices of `images` in `collect`'s layout (prompt by prompt: `per` conditional rows, then
    their `per` unconditional twins): all conditional rows first, then the unconditional ones."""
    if not uses_cfg:
        return images
    cond = images // per * 2 * per + images % per
    return torch.cat([cond, cond + per])


def initial_net(model, args) -> EagleNet:
    """A fresh layer (`--attn-band`, `--intermediate-size`), or `--init`'s drafter (checked against the
    model as any drafter file is; its shape wins, a conflicting flag is an error)."""
    if not args.init:
        return EagleNet(EagleConfig.for_model(model, args.attn_band, args.intermediate_size))
    net = load_eagle(model, args.init)
    for flag, asked, have in (("--attn-band", args.attn_band, net.cfg.attn_band),
                              ("--intermediate-size", args.intermediate_size, net.cfg.intermediate_size)):
        if asked and asked != have:
            raise ValueError(f"{flag} {asked} conflicts with --init {args.init} (its drafter has {have}); "
                             f"drop the flag or train from scratch")
    return net


def train_eagle(model, args):
    fill_defaults(args, (("per_prompt", 8), ("attn_band", None), ("intermediate_size", 0), ("init", None),
                         ("guided_weight", 0.0)))
    if args.guided_weight < 0:
        raise ValueError(f"--guided-weight must be >= 0 (0 = per-branch losses only), got {args.guided_weight}")
    net = initial_net(model, args)  # a bad --init fails before the data is sampled
    t_start = time.perf_counter()
    feats, toks, t_data = collect(model, args)
    dev = model.device
    feats, toks = feats.to(dev), toks.to(dev)
    cfg, net = net.cfg, net.to(dev)
    sampling = frozen_target_sampling(model)  # what `generate` samples with unless told otherwise
    forced = (model.geometry.forced_tokens() >= 0).to(dev)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    R = feats.shape[0]
    uses_cfg = sampling.uses_cfg
    rows_per_image = 2 if uses_cfg else 1  # collect's layout: both CFG branches are rows
    per = max(1, min(args.per_prompt, args.images))
    weight = args.guided_weight

    def loss_fn(step):
        if weight:  # batch / 2 images, each as both of its CFG rows (guided_kl pairs them)
            images = torch.randint(R // rows_per_image, (max(1, min(args.batch, R) // rows_per_image),), generator=g)
            idx = paired_rows(images, per, uses_cfg).to(dev)
        else:
            idx = torch.randint(R, (min(args.batch, R),), generator=g).to(dev)
        return eagle_loss(net, model, feats[idx], toks[idx], forced, guided_weight=weight,
                          sampling=sampling if weight else None)[0]

    os.makedirs(args.out, exist_ok=True)
    record = train(net, loss_fn, args.steps, args.out, args.lr, resume=args.resume,
                    schedule=getattr(args, "lr_schedule", "constant"))
    # held-out style check on the training data: the losses without input noise on 8 images
    with torch.no_grad():
        idx = paired_rows(torch.arange(min(R // rows_per_image, 8)), per, uses_cfg).to(dev)
        loss, reg, ce, kl = eagle_loss(net, model, feats[idx], toks[idx], forced, noise=0.0, guided_weight=weight,
                                       sampling=sampling)
    training = {"time_s": round(time.perf_counter() - t_start, 1), "data_s": round(t_data, 1),
                "train_s": round(record["seconds"], 1), "steps": args.steps, "loss": record["final_loss"],
                "eval_loss": float(loss), "eval_reg": float(reg), "eval_ce": float(ce), "eval_guided_kl": float(kl),
                "images": int(toks.shape[0] // rows_per_image),
                "batch": args.batch, "lr": args.lr, "lr_schedule": record["schedule"],
                "resumed_from": record["resumed_from"], "seed": args.seed, "guided_weight": weight,
                "init": os.path.abspath(args.init) if args.init else None}
    save_drafter(args.out, "eagle", model, net.state_dict(), cfg.to_dict(), training=training)
    print(f"saved {args.out}: {training}")
    return net
