"""Self-distillation data: the target model samples images from prompts (plain AR, its own
recommended settings), then each sequence is teacher-forced through the target once to record,
at every position, the hidden states of both CFG branches. A drafter then learns the target's
OWN distributions (computed from those hidden states with the target's head), so no dataset is
needed and what it learns is exactly what it will be verified against.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..model_loaders.contract import ARImageModel


@dataclass
class DistillBatch:
    sequence: torch.Tensor  # [B, seq_len] engine ids (structure tokens included)
    # hidden[:, j]: the target's last hidden state at sequence position j (its output predicts j + 1)
    hidden: torch.Tensor  # [B, seq_len - 1, D] conditional branch
    hidden_uncond: Optional[torch.Tensor]  # [B, seq_len - 1, D] (CFG) or None
    first_hidden: torch.Tensor  # [B, D] at the prompt's last token (its output predicts position 0)
    first_hidden_uncond: Optional[torch.Tensor]
    prompts: list


def training_prompts(model: ARImageModel, n: int, seed: int) -> list:
    """Prompts to distil on: the demo model's own data generator for the demo model; otherwise the
    caller passes a prompt file (see cli/train_drafter.py)."""
    if model.name != "demo":
        raise ValueError(f"model {model.name!r} needs --prompts FILE (one prompt per line) for drafter training")
    import numpy as np
    from ..model_loaders.demo.data import prompt_of, random_scene
    rng = np.random.default_rng(seed)
    return [prompt_of(random_scene(rng)) for _ in range(n)]


@torch.inference_mode()
def chunked_distill_batch(model, prompt: str, batch: int, seed: int, chunk: int = 128) -> DistillBatch:
    """`batch` images the target samples for `prompt` (plain AR, its recommended settings), with
    their hidden states from teacher forcing in chunks of `chunk` positions (models whose
    position limit is below prompt + 2 * image, as the demo's 512, cannot take the whole image
    as one draft)."""
    from ..samplers.api import generate
    res = generate(model, prompt, backend="ar", seed=seed, batch_size=batch)
    uses_cfg = model.default_sampling.get("cfg_scale", 1.0) != 1.0
    seq = res.sequence.to(model.device)
    B, n = seq.shape
    session = model.start(model.encode_prompt(prompt), B, uses_cfg, draft_capacity=chunk + 1)
    hs, hus = [], []
    for s in range(0, n - 1, chunk):
        e = min(s + chunk, n - 1)
        out = model.forward(session, seq[:, s:e], [-1] + list(range(e - s - 1)))
        hs.append(out.hidden)
        hus.append(out.hidden_uncond)
        path = torch.arange(e - s, device=model.device).expand(B, e - s)
        model.commit(session, path, torch.full((B,), e - s, device=model.device))
    first = session.first
    return DistillBatch(sequence=res.sequence, hidden=torch.cat(hs, 1),
                        hidden_uncond=torch.cat(hus, 1) if uses_cfg else None, first_hidden=first.hidden[:, 0],
                        first_hidden_uncond=first.hidden_uncond[:, 0] if uses_cfg else None, prompts=[prompt] * B)


def distill_features(model, args, log=sys.stderr):
    """The target's own samples and features for drafter training (EAGLE and Hawk): `args.images`
    images, `args.per_prompt` per prompt. Returns (feats [R, n, D], feats_uncond [R, n, D] or None
    without CFG, tokens [R, n], seconds); feature index j is the hidden state that predicted j."""
    per = max(1, min(args.per_prompt, args.images))
    n_prompts = max(1, args.images // per)
    prompts = training_prompts(model, n_prompts, args.seed) if args.prompts is None else \
        [l.strip() for l in open(args.prompts, encoding="utf-8") if l.strip()][:n_prompts]
    fc, fu, toks = [], [], []
    t0 = time.perf_counter()
    for i, pr in enumerate(prompts):
        b = chunked_distill_batch(model, pr, per, seed=args.seed * 100003 + i)
        toks.append(b.sequence.cpu())
        fc.append(torch.cat([b.first_hidden[:, None], b.hidden], 1).float().cpu())
        if b.hidden_uncond is not None:
            fu.append(torch.cat([b.first_hidden_uncond[:, None], b.hidden_uncond], 1).float().cpu())
        log.write(f"\rdistillation data: {i + 1}/{len(prompts)} prompts, {time.perf_counter() - t0:.0f}s ")
        log.flush()
    log.write("\n")
    return torch.cat(fc), (torch.cat(fu) if fu else None), torch.cat(toks), time.perf_counter() - t0


def start_head_training(model, args, defaults, log=sys.stderr):
    """What a trainer of heads on the target's features (Hawk, spatial) starts with: `args` with
    `defaults` filled in, then (feats [R, n, D] and feats_uncond (or None) on the model's device,
    index i predicting position i; seconds of data; the start time; the frozen target's sampling)."""
    from .loop import fill_defaults, frozen_target_sampling
    fill_defaults(args, defaults)
    t_start = time.perf_counter()
    fc, fu, _, secs = distill_features(model, args, log)
    fc, fu = fc.to(model.device), (fu.to(model.device) if fu is not None else None)
    return fc, fu, secs, t_start, frozen_target_sampling(model)
