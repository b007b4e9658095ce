"""gpu-check's quantized stage: int8 and int4 weight-only weights against bf16 at the Lumina-mGPT 7B shape
(tooling/shapes.py, random weights built on the device): forward ms at the verify widths' matrix rows (`quant_rows`:
1 and 17 rows without CFG; 2, 34 and 66 with it: AR, window 16 and window 32 with CFG), peak device memory and the
weights' bytes, per variant: bf16, ours (model_loaders/precision/quantize.py: dequantises each weight inside the
matmul) and torchao's (int8; int4 in each packing, `TORCHAO_INT4_PACKINGS`) or bitsandbytes' kernels where that
library is importable (never required: recorded as not installed otherwise; a packing this torchao or this GPU
lacks: its error); then the exactness case on each quantized target: AR against the default backend in the
same-image mode over the first rows of an image (tokens differing, first difference), plain and shape-pinned
(both at the default backend's verify width).

On the CPU (the dry run) the same path runs at tiny widths, once per token count: "no CUDA: kernels not timed"."""
from __future__ import annotations

import importlib
import statistics
import time

import torch

from ..shapes import SHAPES, random_decoder, sync
from .records import error_text
from .timed_generation import compare_tokens, timed_generation

NOT_TIMED = "no CUDA: kernels not timed"
EXACTNESS_ROWS = 1  # rows of the exactness case's image (AR and the default backend, plain and pinned)
# torchao's int4 weight-only packings (Int4WeightOnlyConfig's int4_packing_format, torchao >= 0.14): tinygemm, the
# plain (fbgemm) one that is torchao 0.18's default, and fbgemm's preshuffled (Hopper)
TORCHAO_INT4_PACKINGS = ("tile_packed_to_4d", "plain", "preshuffled")


def _version(module: str):
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception:  # noqa: BLE001 -- not installed, or broken on this machine
        return None


def _torchao(module, bits: int, packing=None) -> None:
    from torchao import quantization as q
    if hasattr(q, "Int8WeightOnlyConfig"):  # torchao >= 0.10
        packed = {} if packing is None else {"int4_packing_format": packing}  # a torchao without it: TypeError
        config = q.Int8WeightOnlyConfig() if bits == 8 else q.Int4WeightOnlyConfig(group_size=128, **packed)
    elif packing is None:
        config = q.int8_weight_only() if bits == 8 else q.int4_weight_only(group_size=128)
    else:
        raise ValueError(f"torchao {_version('torchao')} has no int4 packing formats")
    q.quantize_(module, config)


def _bitsandbytes(module, bits: int) -> None:
    """Every nn.Linear but the head as bitsandbytes' Linear8bitLt / Linear4bit (weights quantized on the move to
    the GPU; the stage runs 4-bit)."""
    import bitsandbytes as bnb
    from torch import nn
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and name != "lm_head":
            new = (bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=child.bias is not None,
                                       has_fp16_weights=False) if bits == 8 else
                   bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                     compute_dtype=torch.bfloat16))
            new.weight = (bnb.nn.Int8Params if bits == 8 else bnb.nn.Params4bit)(
                child.weight.data.cpu(), requires_grad=False)
            setattr(module, name, new.to(child.weight.device))
        else:
            _bitsandbytes(child, bits)


def variants(cuda: bool, installed_only: bool = True) -> list:
    """(name, quantizer or None): bf16, ours, then each importable library's (bitsandbytes on CUDA only; torchao's
    int4 in its installed version's default and in each packing); `installed_only=False` (the plan on a machine
    without them): every library's, as a GPU machine that has them runs them."""
    from ...model_loaders.precision.quantize import quantize_module
    out = [("bf16", None)] + [(f"ours {m}", lambda mod, m=m: quantize_module(mod, m)) for m in ("int8", "int4")]
    if _version("torchao") or not installed_only:
        out += [("torchao int8", lambda mod: _torchao(mod, 8)), ("torchao int4", lambda mod: _torchao(mod, 4))]
        out += [(f"torchao int4 {p}", lambda mod, p=p: _torchao(mod, 4, p)) for p in TORCHAO_INT4_PACKINGS]
    if cuda and (_version("bitsandbytes") or not installed_only):
        out.append(("bitsandbytes int4", lambda mod: _bitsandbytes(mod, 4)))
    return out


def _weights_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _variant(ctx, name, quantize, shape, dev) -> dict:
    from ...model_loaders.contract import ImageGeometry
    from ...model_loaders.families.llama_adapter import IMAGE_OFFSET, LlamaImageModel, byte_text_encoder
    from ...samplers.backends import DEFAULT_BACKEND, make_backend
    opt, cuda = ctx.options, dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    geometry = ImageGeometry(shape["grid"], shape["grid"], shape["image_codes"], row_end=True)
    t = time.perf_counter()
    dec = random_decoder(shape, dev, torch.bfloat16, max_positions=geometry.seq_len + 256)
    if quantize is not None:
        quantize(dec)
    sync(dev)
    model = LlamaImageModel(dec, geometry, byte_text_encoder(IMAGE_OFFSET + shape["image_codes"]), name=shape["name"])
    model.default_sampling = {"cfg_scale": 3.0, "top_k": shape["top_k"]}
    rec = {"build_s": round(time.perf_counter() - t, 2), "weights_bytes": _weights_bytes(dec)}
    enc = model.encode_prompt("a photo of a cat on a sofa", "")
    ms = {}
    with torch.inference_mode():
        for cfg in (False, True):  # an odd row count: one row per token; an even one: 2 CFG rows per token
            counts = [r for r in opt["quant_rows"] if (r % 2 == 0) == cfg]
            if not counts:
                continue
            session = model.start(enc, 1, cfg, draft_capacity=max(counts) // (1 + cfg))
            for rows in counts:
                ms[rows] = _forward_ms(model, session, rows // (1 + cfg), dev, opt["repeats_quant"])
            session = None
    rec["forward_ms"] = {str(rows): ms[rows] for rows in opt["quant_rows"]}  # keyed by matrix rows
    rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev) if cuda else None
    ctx.track_memory()
    limit = EXACTNESS_ROWS * (geometry.width + 1)
    width = make_backend(DEFAULT_BACKEND).verify_width(model)
    for key, pin in (("exactness", None), ("exactness_pinned", width)):
        ref, ar = timed_generation(model, "a photo of a cat", "ar", limit, seed=opt["seed"], pin_width=pin)
        tokens, other = timed_generation(model, "a photo of a cat", DEFAULT_BACKEND, limit, seed=opt["seed"],
                                         pin_width=pin)
        rec[key] = {"backend": DEFAULT_BACKEND, "positions": limit, **compare_tokens(tokens, ref),
                    "same_image_guarantee": ar["same_image_guarantee"], "pin_width": pin,
                    "ar_step_ms_median": ar["step_ms_median"] if cuda else NOT_TIMED,
                    "backend_step_ms_median": other["step_ms_median"] if cuda else NOT_TIMED}
    return rec


def _forward_ms(model, session, T: int, dev, repeats: int):
    """Median ms of a forward of T tokens (a chain) after a first, untimed call; on the CPU: not timed."""
    tok = torch.zeros(1, T, dtype=torch.long, device=dev)
    parents = list(range(-1, T - 1))
    model.forward(session, tok, parents)  # first call (kernel selection, caches)
    sync(dev)
    if dev.type != "cuda":
        return NOT_TIMED
    ms = []
    for _ in range(repeats):
        t = time.perf_counter()
        model.forward(session, tok, parents)
        sync(dev)
        ms.append(1e3 * (time.perf_counter() - t))
    return statistics.median(ms)


def stage_quantized(ctx) -> None:
    opt = ctx.options
    dev = torch.device(opt["device"])
    cuda = dev.type == "cuda"
    shape = SHAPES["chameleon-7b" if cuda and not opt["dry_run"] else "small"]
    r = ctx.result
    r.update(shape=dict(shape), dtype="bfloat16", device=str(dev), rows=list(opt["quant_rows"]),
             libraries={m: _version(m) for m in ("torchao", "bitsandbytes")}, variants={},
             **({} if cuda else {"note": NOT_TIMED}))
    for name, quantize in variants(cuda):
        if ctx.time_left() < 10:
            r["variants"][name] = {"skipped": "stage budget spent"}
            continue
        try:
            r["variants"][name] = _variant(ctx, name, quantize, shape, dev)
        except Exception as e:  # noqa: BLE001 -- the next variant still runs
            r["variants"][name] = {"error": error_text(e)}
        finally:
            if cuda:
                torch.cuda.empty_cache()
        base = r["variants"].get("bf16", {}).get("forward_ms", {})
        for v in r["variants"].values():
            fw = v.get("forward_ms") or {}
            v["forward_vs_bf16"] = {T: ms / base[T] for T, ms in fw.items()
                                    if isinstance(ms, float) and isinstance(base.get(T), float)}
        ctx.save()


__all__ = ["NOT_TIMED", "stage_quantized", "variants"]
