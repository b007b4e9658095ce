"""Self-distillation data: the target model samples images from prompts (plain AR, its own
recommended settings), then each sequence is teacher-forced through the target once to record,
at every position, the hidden states of both CFG branches. A drafter then learns the target's
OWN distributions (computed from those hidden states with the target's head), so no dataset is
needed and what it learns is exactly what it will be verified against.
"""
from __future__ import annotations

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
def teacher_force(model: ARImageModel, prompt: str, sequences: torch.Tensor, cfg: bool, negative_prompt: str = ""):
    """Hidden states of `sequences` [B, seq_len] (one prompt for all rows) in one chain forward."""
    encoded = model.encode_prompt(prompt, negative_prompt)
    B, n = sequences.shape
    session = model.start(encoded, B, cfg, draft_capacity=n)
    out = model.forward(session, sequences[:, :-1].to(model.device), [-1] + list(range(n - 2)))
    return session.first, out


@torch.inference_mode()
def distill_batch(model: ARImageModel, prompt: str, batch: int, seed: int, **sampling) -> DistillBatch:
    """`batch` images the target samples for `prompt` (plain AR), with their hidden states."""
    from ..samplers.api import generate
    res = generate(model, prompt, backend="ar", seed=seed, batch_size=batch, **sampling)
    cfg = (sampling.get("cfg_scale") or getattr(model, "default_sampling", {}).get("cfg_scale", 1.0)) != 1.0
    first, out = teacher_force(model, prompt, res.sequence, cfg)
    return DistillBatch(sequence=res.sequence, hidden=out.hidden, hidden_uncond=out.hidden_uncond,
                        first_hidden=first.hidden[:, 0], prompts=[prompt] * batch,
                        first_hidden_uncond=None if first.hidden_uncond is None else first.hidden_uncond[:, 0])
