"""Batch-invariant target forwards: "same image as AR" for half-precision models on the CPU.

Why, and what `same_image_plan` chooses per generation (this mode, shape pinning, or outside the guarantee):
docs/ARCHITECTURE.md, "Batch-invariant half precision"; shape pinning: docs/REPRODUCIBLE.md, "Shape pinning".

Why float64 gives every forward shape the same bits: a product of two bf16 / fp16 values is exact in float64 and a
float64 sum of n terms is within about n * 2^-53 of its exact value, in any order; so the rounded result is the same
unless the exact value lies that close to a rounding boundary of the dtype (2^-8 relative apart in bf16). The other
ops the families run (+, -, *, /, casts, data movement) round each element on their own, whatever the shape. An op
that torch reaches only inside an unlisted torch function (which runs with the mode off) escapes it: the families'
forwards reach none (checked per op with a dispatch trace).
"""
from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

import torch
from torch.overrides import TorchFunctionMode

PRODUCTS = {"linear", "bilinear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm",
            "mv", "addmv", "dot", "einsum", "tensordot", "scaled_dot_product_attention"}
ROW_OPS = {"softmax", "log_softmax", "mean", "sum", "var", "std", "var_mean", "norm", "logsumexp", "layer_norm",
           "rms_norm", "group_norm", "cumsum", "exp", "log", "sigmoid", "silu", "gelu", "tanh", "rsqrt", "sqrt",
           "pow", "__pow__", "__rpow__", "sin", "cos", "erf", "softplus", "exp2", "expm1", "log1p", "log2"}
_COVERED = frozenset(PRODUCTS | ROW_OPS)
_LOW = (torch.bfloat16, torch.float16, torch.float32)
_HALF = (torch.bfloat16, torch.float16)


class SameImage(str, enum.Enum):
    """How firmly a same-image run (reproducible / same_image_as_ar on) gives AR's image for the seed: the stats'
    `same_image_guarantee` (its value, a plain string in JSON; None outside the same-image mode). The distribution
    is AR's in every case; this is only about the very image."""

    # half precision on the CPU through BatchInvariant: every product and reduction in float64, so each forward
    # rounds to the same bits unless an exact value lies within about n * 2^-53 of a rounding boundary (argued
    # above; tested: no demo image differs, docs/REPRODUCIBLE.md)
    BATCH_INVARIANT = "batch_invariant"
    # every forward of the generation at one width (shape pinning), on a device where gpu-check measured that to
    # give AR's tokens (PINNED_DEVICES)
    SHAPE_PINNED = "shape_pinned"
    # float32 on the CPU (or CUDA without TF32): no tested image differs, but float32 GEMM is not proven to give
    # the same bits whatever the forward's shape
    TESTED = "tested"
    # half precision on a GPU, TF32 products, or a model whose dtype is unknown: the image may differ from AR's
    NOT_GUARANTEED = "not_guaranteed"


# device types where pinning alone gave AR's tokens in half precision (gpu-check's images stage decides: none yet)
PINNED_DEVICES: frozenset = frozenset()
# the one width of every forward there, AR's and every backend's (so that any two give the same image): above the
# widest default verify width on the demo model (spatial's band, 74 tokens); a wider backend is not guaranteed
PINNED_WIDTH = 80


def _wide(x, seen: dict):
    """x with its bf16 / fp16 / fp32 tensors as float64 (their dtypes listed in seen["tensors"]) and a
    dtype argument (the result dtype the caller asks for, listed in seen["asked"]) among those as float64."""
    if isinstance(x, torch.Tensor) and x.dtype in _LOW:
        seen["tensors"].append(x.dtype)
        return x.double()
    if isinstance(x, torch.dtype):
        seen["asked"].append(x)
        return torch.float64 if x in _LOW else x
    if isinstance(x, (list, tuple)):
        return type(x)(_wide(v, seen) for v in x)
    return x


def _narrow(out, dtype):
    if isinstance(out, torch.Tensor):
        return out.to(dtype) if out.dtype == torch.float64 else out
    if isinstance(out, tuple):
        return type(out)(_narrow(v, dtype) for v in out)
    return out


class BatchInvariant(TorchFunctionMode):
    """Inside it, `PRODUCTS` and `ROW_OPS` of bf16 / fp16 / fp32 tensors compute in float64 and round
    to the dtype the op returns (its ``dtype`` argument, else its first such tensor's). An op writing
    to ``out=`` runs as it is; ``inplace=True`` (F.silu and the like) writes the rounded result back."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) not in _COVERED or "out" in kwargs:
            return func(*args, **kwargs)
        seen = {"tensors": [], "asked": []}
        wide_args, wide_kwargs = _wide(args, seen), {k: _wide(v, seen) for k, v in kwargs.items()}
        if not seen["tensors"]:  # no bf16 / fp16 / fp32 tensor: nothing to widen
            return func(*args, **kwargs)
        dtype = (seen["asked"] or seen["tensors"])[0]
        if kwargs.get("inplace"):
            wide_kwargs["inplace"] = False
            return args[0].copy_(func(*wide_args, **wide_kwargs))
        return _narrow(func(*wide_args, **wide_kwargs), dtype)


def _half_dtype(model) -> Optional[torch.dtype]:
    """The half-precision dtype of the model's weights and buffers, None when none is bf16 / fp16."""
    module = model.torch_module()
    for t in (*module.parameters(), *module.buffers()):
        if t.dtype in _HALF:
            return t.dtype
    return None


class ShapePinned(contextlib.nullcontext):
    """The target forwards' context when the shapes are pinned: nothing to switch; the engine runs every forward
    through `pinned_forward` at one width."""


def pinned_forward(model, session, tokens: torch.Tensor, parents, width: int):
    """``model.forward`` of the T nodes ``tokens`` [B, T] (``parents``: a list, or [B, T] per row) at `width`
    tokens: width - T padding nodes (token 0, children of the committed prefix) after them; the output cut back
    to the T nodes."""
    B, T = tokens.shape
    if T > width:
        raise ValueError(f"a forward of {T} tokens does not fit the pinned width {width}")
    if T < width:
        tokens = torch.cat([tokens, tokens.new_zeros(B, width - T)], 1)
        if isinstance(parents, torch.Tensor) and parents.dim() == 2:
            parents = torch.cat([parents, parents.new_full((B, width - T), -1)], 1)
        else:
            parents = [int(p) for p in parents] + [-1] * (width - T)
    out = model.forward(session, tokens, parents)
    return type(out)(*(None if t is None else t[:, :T] for t in (out.cond, out.uncond, out.hidden,
                                                                 out.hidden_uncond)))


def target_forward_mode(model, reproducible: bool, pin_width: Optional[int] = None):
    """(a context manager for the target's forwards, the stats' ``same_image_guarantee`` (a `SameImage`), the reason
    in words) of a generation: `BatchInvariant` for a half-precision model on the CPU in the same-image mode,
    `ShapePinned` for one on a device of `PINNED_DEVICES` or when `pin_width` asks for pinning, else a no-op;
    (no-op, None, None) outside the same-image mode."""
    if not reproducible:
        return contextlib.nullcontext, None, None
    try:
        half, device = _half_dtype(model), model.device.type
    except NotImplementedError:  # an adapter that does not expose its weights
        return contextlib.nullcontext, SameImage.NOT_GUARANTEED, "the model's dtype is unknown"
    if pin_width is not None:  # pinning alone, asked for
        if half is None:
            return ShapePinned, SameImage.TESTED, "float32: tested on the CPU, not proven"
        if device in PINNED_DEVICES:
            return ShapePinned, SameImage.SHAPE_PINNED, f"{str(half)[6:]} on {device}: shape-pinned forwards"
        return ShapePinned, SameImage.NOT_GUARANTEED, f"shape-pinned {str(half)[6:]} on {device}, not verified there"
    if half is not None and device in PINNED_DEVICES:
        return ShapePinned, SameImage.SHAPE_PINNED, f"{str(half)[6:]} on {device}: shape-pinned forwards"
    if half is None:
        if device == "cuda" and torch.backends.cuda.matmul.allow_tf32:
            return contextlib.nullcontext, SameImage.NOT_GUARANTEED, "float32 products in TF32 on CUDA (allow_tf32)"
        return contextlib.nullcontext, SameImage.TESTED, "float32: tested on the CPU, not proven"
    if device != "cpu":
        return contextlib.nullcontext, SameImage.NOT_GUARANTEED, (f"{str(half)[6:]} on {device} (batch-invariant "
                                                                  f"forwards run on the CPU only)")
    return BatchInvariant, SameImage.BATCH_INVARIANT, f"{str(half)[6:]} on the CPU: batch-invariant forwards"



@dataclass(frozen=True)
class SameImagePlan:
    """How one generation's target forwards run (`same_image_plan`): the stats' `same_image_guarantee` and reason."""

    mode: Callable[[], ContextManager]  # the context of every target forward (BatchInvariant, ShapePinned, a no-op)
    pin_width: Optional[int]  # every target forward at this many tokens (shape pinning), or None
    guarantee: Optional[SameImage]  # None outside the same-image mode
    reason: Optional[str]


def same_image_plan(model, reproducible: bool, backend: str, widest: int,
                    pin_width: Optional[int] = None) -> SameImagePlan:
    """The plan of a generation whose widest forward (`backend`'s) is `widest` tokens: `target_forward_mode`'s,
    with the pinned width where it pins (`pin_width`, checked: at least `widest`, same-image mode only; else
    `PINNED_WIDTH`, or `widest` when wider: AR pads to PINNED_WIDTH only, so that is no guarantee)."""
    if pin_width is not None:
        if isinstance(pin_width, bool) or not isinstance(pin_width, int) or pin_width < widest:
            raise ValueError(f"pin_width must be an int >= {widest} ({backend}'s widest forward), got {pin_width!r}")
        if not reproducible:
            raise ValueError("pin_width pins the forwards of the same-image mode: it needs reproducible "
                             "(same_image_as_ar) on")
    mode, guarantee, reason = target_forward_mode(model, reproducible, pin_width)
    if pin_width is None and mode is not ShapePinned:
        return SameImagePlan(mode, None, guarantee, reason)
    width = max(widest, PINNED_WIDTH) if pin_width is None else pin_width
    if pin_width is None and width > PINNED_WIDTH:
        return SameImagePlan(mode, width, SameImage.NOT_GUARANTEED,
                             f"{backend}'s forwards of {width} tokens are wider than the pinned width {PINNED_WIDTH}")
    return SameImagePlan(mode, width, guarantee, f"{reason} (every forward at {width} tokens)")
