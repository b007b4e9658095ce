"""Weight fingerprints: how a trained drafter (Hawk heads, an EAGLE layer) names the exact target
model it was trained on, so that a drafter for another model is refused instead of silently
proposing garbage (still lossless, but slow).

A fingerprint records every parameter's name and shape and, for up to `SAMPLED` evenly chosen
tensors, the mean and mean-absolute value of a fixed strided sample. Comparison allows a small
relative tolerance, so the same checkpoint loaded in bf16, fp16 or fp32, or on another device,
matches, while any other set of weights (another seed, another fine-tune) does not.
"""
from __future__ import annotations

from typing import Optional

import torch

SAMPLED = 8
SAMPLE_SIZE = 4096
REL_TOL = 2e-2


def _weights(module: torch.nn.Module) -> dict:
    """name -> a function giving the tensor: the parameters, and for a quantized linear layer
    (precision/quantize.py) its dequantized weight under the name the layer's weight had (one at a time: never
    all dequantized at once), so a drafter trained on the unquantized model matches the quantized one."""
    out = {n: (lambda p=p: p) for n, p in module.named_parameters()}
    for name, m in module.named_modules():
        if hasattr(m, "dequantized_weight"):
            out[f"{name}.weight"] = lambda m=m: m.dequantized_weight(m.scales.dtype)
            if m.bias is not None:
                out[f"{name}.bias"] = lambda m=m: m.bias
    return out


def weights_fingerprint(module: torch.nn.Module) -> dict:
    """{"shapes": {name: [dims]}, "stats": {name: [mean, mean_abs]}} (JSON-serialisable)."""
    params = _weights(module)
    names = sorted(params)
    shapes = {n: list(params[n]().shape) for n in names}
    big = [n for n in names if torch.Size(shapes[n]).numel() >= 16]
    if len(big) > SAMPLED:
        big = [big[round(i * (len(big) - 1) / (SAMPLED - 1))] for i in range(SAMPLED)]
    stats = {}
    with torch.no_grad():
        for n in big:
            flat = params[n]().detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLE_SIZE)
            x = flat[::step][:SAMPLE_SIZE].double().cpu()
            stats[n] = [float(x.mean()), float(x.abs().mean())]
    return {"shapes": shapes, "stats": stats}


def fingerprint_mismatch(expected: dict, actual: dict) -> Optional[str]:
    """None when the fingerprints describe the same weights, else a short reason."""
    es, as_ = expected.get("shapes", {}), actual.get("shapes", {})
    if es != as_:
        diff = sorted(set(es) ^ set(as_))[:3] or [n for n in es if es[n] != as_.get(n)][:3]
        return f"the parameter names or shapes differ (first: {', '.join(diff)})"
    for name, (mean, mean_abs) in expected.get("stats", {}).items():
        got = actual.get("stats", {}).get(name)
        if got is None:
            return f"no statistics for {name}"
        scale = max(abs(mean_abs), 1e-12)
        if abs(got[1] - mean_abs) > REL_TOL * scale or abs(got[0] - mean) > REL_TOL * scale:
            return f"the values of {name} differ (mean |w| {got[1]:.6g} vs {mean_abs:.6g})"
    return None
