"""gpu-check's quantized stage: int8 and int4 weight-only weights against bf16 at the Lumina-mGPT 7B shape
(tooling/shapes.py, random weights built on the device): forward ms for 1 and 17 tokens x 2 CFG rows, peak device
memory and the weights' bytes, per variant: bf16, ours (model_loaders/precision/quantize.py: dequantises each weight inside the
matmul) and torchao's or bitsandbytes' kernels where that library is importable (never required: recorded as not
installed otherwise); then the exactness case on each quantized target: AR against the default backend in the
same-image mode over the first rows of an image (tokens differing, first difference).

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
EXACTNESS_ROWS = 2  # rows of the exactness case's image (AR and the default backend)


def _version(module: str):
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception:  # noqa: BLE001 -- not installed, or broken on this machine
        return None


def _torchao(module, bits: int) -> None:
    from torchao import quantization as q
    if hasattr(q, "Int8WeightOnlyConfig"):  # torchao >= 0.10
        config = q.Int8WeightOnlyConfig() if bits == 8 else q.Int4WeightOnlyConfig(group_size=128)
    else:
        config = q.int8_weight_only() if bits == 8 else q.int4_weight_only(group_size=128)
    q.quantize_(module, config)


def _bitsandbytes(module, bits: int) -> None:
    """Every nn.Linear but the head as bitsandbytes' Linear8bitLt / Linear4bit (weights quantized on the move to
    the GPU)."""
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


def variants(cuda: bool) -> list:
    """(name, quantizer or None): bf16, ours, then each importable library's (bitsandbytes on CUDA only)."""
    from ...model_loaders.precision.quantize import quantize_module
    out = [("bf16", None)] + [(f"ours {m}", lambda mod, m=m: quantize_module(mod, m)) for m in ("int8", "int4")]
    if _version("torchao"):
        out += [(f"torchao int{b}", lambda mod, b=b: _torchao(mod, b)) for b in (8, 4)]
    if cuda and _version("bitsandbytes"):
        out += [(f"bitsandbytes int{b}", lambda mod, b=b: _bitsandbytes(mod, b)) for b in (8, 4)]
    return out


def _weights_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _variant(ctx, name, quantize, shape, dev) -> dict:
    from ...model_loaders.contract import ImageGeometry
    from ...model_loaders.families.llama_adapter import IMAGE_OFFSET, LlamaImageModel, byte_text_encoder
    from ...samplers.backends import DEFAULT_BACKEND
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
    rec = {"build_s": round(time.perf_counter() - t, 2), "weights_bytes": _weights_bytes(dec), "forward_ms": {}}
    enc = model.encode_prompt("a photo of a cat on a sofa", "")
    T_max = max(opt["quant_tokens"])
    with torch.inference_mode():
        session = model.start(enc, 1, True, draft_capacity=T_max)
        for T in opt["quant_tokens"]:
            tok = torch.zeros(1, T, dtype=torch.long, device=dev)
            parents = list(range(-1, T - 1))
            model.forward(session, tok, parents)  # first call (kernel selection, caches)
            sync(dev)
            if not cuda:
                rec["forward_ms"][str(T)] = NOT_TIMED
                continue
            ms = []
            for _ in range(opt["repeats_quant"]):
                t = time.perf_counter()
                model.forward(session, tok, parents)
                sync(dev)
                ms.append(1e3 * (time.perf_counter() - t))
            rec["forward_ms"][str(T)] = statistics.median(ms)
        session = None
    rec["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev) if cuda else None
    ctx.track_memory()
    limit = EXACTNESS_ROWS * (geometry.width + 1)
    ref, ar = timed_generation(model, "a photo of a cat", "ar", limit, seed=opt["seed"])
    tokens, other = timed_generation(model, "a photo of a cat", DEFAULT_BACKEND, limit, seed=opt["seed"])
    rec["exactness"] = {"backend": DEFAULT_BACKEND, "positions": limit, **compare_tokens(tokens, ref),
                        "same_image_guarantee": ar["same_image_guarantee"],
                        "ar_step_ms_median": ar["step_ms_median"] if cuda else NOT_TIMED,
                        "backend_step_ms_median": other["step_ms_median"] if cuda else NOT_TIMED}
    return rec


def stage_quantized(ctx) -> None:
    opt = ctx.options
    dev = torch.device(opt["device"])
    cuda = dev.type == "cuda"
    shape = SHAPES["chameleon-7b" if cuda and not opt["dry_run"] else "small"]
    r = ctx.result
    r.update(shape=dict(shape), dtype="bfloat16", device=str(dev), cfg_rows=2,
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
