"""The model a command runs, from its `--model` spec: a built-in name or a model folder (load_model), or
`tiny:VOCAB,HxW[,row_end][,key=value...]`, a random-weight model (testing.tiny_model) for checking a command
and for the bench's `flat` regime."""
from __future__ import annotations

# tiny:...,key=value options: testing.tiny_model's keyword and its type
TINY_OPTIONS = {"hidden": ("hidden_size", int), "layers": ("num_layers", int), "heads": ("num_heads", int),
                "scale": ("logit_scale", float), "seed": ("seed", int)}


def tiny_from_spec(spec: str, device=None):
    """tiny:vocab,HxW[,row_end][,hidden=..,layers=..,heads=..,scale=..,seed=..]: the options default to
    testing.tiny_model's own, seed 0."""
    from ..testing import tiny_model
    parts = [p.strip() for p in spec[5:].split(",")]
    try:
        vocab = int(parts[0])
        h, w = (int(x) for x in parts[1].split("x"))
        kwargs = {"seed": 0}
        for part in parts[2:]:
            if part == "row_end":
                kwargs["row_end"] = True
                continue
            key, eq, value = part.partition("=")
            if not eq or key not in TINY_OPTIONS:
                raise ValueError(part)
            name, kind = TINY_OPTIONS[key]
            kwargs[name] = kind(value)
    except (ValueError, IndexError):
        raise ValueError(f"bad tiny model spec {spec!r}; expected tiny:VOCAB,HxW[,row_end][,key=value...] with keys "
                         f"{', '.join(TINY_OPTIONS)}") from None
    return tiny_model(vocab, (h, w), device=device or "cpu", **kwargs)


def model_from_spec(spec: str, device=None, dtype=None, quantize: str = "none"):
    if spec.startswith("tiny:"):
        if dtype is not None or quantize not in (None, "none"):
            raise ValueError("--dtype and --quantize apply to a model loaded from files (demo, a model folder); a "
                             "tiny: model is float32 and unquantized")
        return tiny_from_spec(spec, device)
    from ..model_loaders.registry import load_model
    return load_model(spec, device=device, dtype=dtype, quantize=quantize)


__all__ = ["TINY_OPTIONS", "model_from_spec"]
