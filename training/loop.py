"""The training loop shared by every drafter kind: AdamW, a progress line, resumable checkpoints.

A checkpoint (``<out>/checkpoint/``) holds the trainable tensors, the optimizer state (flattened
into tensors) and the step, all in safetensors + JSON: `--resume` continues from it exactly.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Callable

import torch

CHECKPOINT = "checkpoint"


def _flat_optimizer(opt: torch.optim.Optimizer) -> dict:
    out = {}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"{i}.{k}"] = v if isinstance(v, torch.Tensor) else torch.tensor(v)
    return out


def save_checkpoint(folder: str, module: torch.nn.Module, opt: torch.optim.Optimizer, step: int, extra: dict) -> None:
    from safetensors.torch import save_file
    d = os.path.join(folder, CHECKPOINT)
    os.makedirs(d, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}, os.path.join(d, "weights.safetensors"))
    save_file({k: v.detach().contiguous().cpu() for k, v in _flat_optimizer(opt).items()}, os.path.join(d, "optimizer.safetensors"))
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump({"step": step, **extra}, f)


def load_checkpoint(folder: str, module: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Restore module, optimizer and step from `folder`/checkpoint; {} when there is none."""
    from safetensors.torch import load_file
    d = os.path.join(folder, CHECKPOINT)
    if not os.path.isfile(os.path.join(d, "state.json")):
        return {}
    try:
        module.load_state_dict(load_file(os.path.join(d, "weights.safetensors")))
        flat = load_file(os.path.join(d, "optimizer.safetensors"))
        with open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
    except Exception as e:  # a checkpoint from another configuration or a broken file
        raise ValueError(f"cannot resume from {d}: {e}; delete it or train into another --out") from e
    sd = opt.state_dict()
    for key, v in flat.items():
        i, name = key.split(".", 1)
        sd["state"].setdefault(int(i), {})[name] = v if name != "step" else v
    opt.load_state_dict(sd)
    return state


SCHEDULES = ("constant", "cosine")


def fill_defaults(args, defaults) -> None:
    """Set each option a kind's training reads but `args` lacks (a caller that is not the CLI):
    ``defaults`` is a dict or (name, value) pairs."""
    for name, default in dict(defaults).items():
        if not hasattr(args, name):
            setattr(args, name, default)


def frozen_target_sampling(model):
    """Freeze the target's weights (drafters train against it) and return the sampling settings
    it generates with unless told otherwise (its default CFG scale and top-k): the distribution
    a drafter learns to propose."""
    from ..samplers.target import SamplingParams
    for prm in model.torch_module().parameters():
        prm.requires_grad_(False)
    ds = model.default_sampling
    return SamplingParams(cfg_scale=ds.get("cfg_scale", 1.0), top_k=ds.get("top_k") or 0)


def learning_rate(lr: float, schedule: str, step: int, steps: int) -> float:
    """The rate of 0-based `step` of `steps`: constant, or cosine from `lr` to 0 over all `steps`.
    A function of the global step, so a resumed run (even one that switches schedule, as the
    shipped demo drafter's second phase) sets the same rate an uninterrupted run would."""
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * step / max(steps, 1)))
    raise ValueError(f"lr schedule {schedule!r} is not one of {SCHEDULES}")


def train(module: torch.nn.Module, loss_fn: Callable[[int], torch.Tensor], steps: int, out: str, lr: float,
          weight_decay: float = 0.1, betas=(0.9, 0.95), resume: bool = False, checkpoint_every: int = 50,
          schedule: str = "constant", log=sys.stderr) -> dict:
    """AdamW on `module`'s parameters for `steps` steps of `loss_fn(step)`; returns the run's record
    (seconds, final_loss, schedule, resumed_from)."""
    learning_rate(lr, schedule, 0, steps)  # a bad schedule name fails before any work
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr, betas=betas,
                            weight_decay=weight_decay)
    start = load_checkpoint(out, module, opt).get("step", 0) if resume else 0
    t0, losses = time.perf_counter(), []
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(lr, schedule, step, steps)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(step)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        done = step + 1
        if done % checkpoint_every == 0 or done == steps:
            save_checkpoint(out, module, opt, done, {"loss": losses[-1]})
        el = time.perf_counter() - t0
        eta = el / max(done - start, 1) * (steps - done)
        log.write(f"\rstep {done}/{steps}  loss {losses[-1]:.4f}  {el:.0f}s elapsed, ~{eta:.0f}s left ")
        log.flush()
    log.write("\n")
    return {"steps": steps, "resumed_from": start, "schedule": schedule, "final_loss": losses[-1] if losses else None,
            "seconds": time.perf_counter() - t0}
