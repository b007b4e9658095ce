"""The target distribution: the ONE place where logits become the probabilities that plain AR
sampling draws from and that every lossless backend verifies against.

Order: CFG on raw logits (uncond + scale * (cond - uncond)), temperature, top-k, top-p.
Temperature 0 is greedy: a one-hot distribution on the argmax (lowest index on ties).
Structure tokens never reach this function: the engine fills forced positions itself, and the
model contract only returns logits of image codes.
"""
from __future__ import annotations

from typing import Optional

import torch

from .sampling import SamplingParams  # re-exported: where its callers import it from


def guided_logits(cond: torch.Tensor, uncond: Optional[torch.Tensor], cfg_scale: float) -> torch.Tensor:
    """CFG on raw logits, in float32 whatever the model's dtype (bf16 / fp16 logits are upcast
    first). A code that either branch masks (-inf) stays masked: uncond + s * (cond - uncond) would
    be -inf - -inf = NaN (or +inf for a code only the unconditional branch forbids)."""
    if uncond is None or cfg_scale == 1.0:
        return cond.float()
    c, u = cond.float(), uncond.float()
    g = u + cfg_scale * (c - u)
    return torch.where(torch.isfinite(c) & torch.isfinite(u), g, float("-inf"))


def kth_largest(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest value along the last dim, keepdim. Same value either way; on CPU
    kthvalue's selection beats topk (which also sorts the k values it returns)."""
    if x.device.type == "cuda":
        return x.topk(k, dim=-1).values[..., -1:]
    return x.kthvalue(x.shape[-1] - k + 1, dim=-1, keepdim=True).values


def target_probs(cond: torch.Tensor, uncond: Optional[torch.Tensor], params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., V] (float32) of the distribution plain AR sampling uses."""
    logits = guided_logits(cond, uncond, params.cfg_scale)
    V = logits.shape[-1]
    top = logits.max(-1, keepdim=True).values
    if params.temperature == 0:
        # a row with no finite logit (NaN, all -inf) has no argmax: NaN marks it for the engine
        greedy = torch.nn.functional.one_hot(logits.argmax(-1), V).to(torch.float32)
        return torch.where(torch.isfinite(top), greedy, float("nan"))
    # shift by the row maximum before dividing: a tiny temperature then gives -inf, never inf - inf.
    # The divisor is at least float32's smallest normal number: a temperature below it (1e-300) would
    # round to 0 in float32 and give 0/0 = NaN at the maximum; at that floor any logit gap over ~1e-36
    # already underflows exp, so the result (the maxima, ties uniform) is what the exact temperature gives.
    logits = (logits - top) / max(float(params.temperature), torch.finfo(torch.float32).tiny)
    if params.top_k and params.top_k < V:
        kth = kth_largest(logits, params.top_k)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        # keep the smallest set of most likely tokens whose mass reaches top_p (the token that
        # crosses the threshold is kept), as transformers' TopPLogitsWarper does
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def invalid_rows(probs: torch.Tensor) -> torch.Tensor:
    """Rows [...] of `target_probs` output that are not a distribution: the model's logits had NaN
    or no finite entry there (fp16 overflow, a broken checkpoint, a mask that forbids everything).
    Sampling from such a row would return an arbitrary token, so the engine stops instead."""
    return ~(probs.sum(-1) > 0.5)  # NaN compares False
