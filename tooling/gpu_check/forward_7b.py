"""gpu-check's forward_7b stage: forward latency of a random-weight Lumina-mGPT-7B-shape model (bf16, built on the
device; tooling/shapes.py) for 1..65 tokens x 2 CFG rows over a full static KV cache, eager and compiled, its eager
launches counted, and the roofline projection re-fitted to them (refit.py)."""
from __future__ import annotations

import time

import torch

from ..shapes import SHAPES, random_decoder, sync
from .backends import compile_totals
from .environment import measured_peaks
from .records import error_text

# aten ops that only make a new view of a tensor: no kernel is launched for them (as tooling/tests/test_roofline.py)
VIEW_OPS = {"view", "_unsafe_view", "reshape", "expand", "transpose", "permute", "slice", "select", "unsqueeze",
            "squeeze", "t", "alias", "detach", "as_strided", "split", "unbind", "narrow", "lift_fresh", "empty"}


def _count_launches(model, session, tokens, parents) -> int:
    """Non-view aten ops of one eager forward: what each launch a kernel on a GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        launches = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOps.launches += func.overloadpacket.__name__ not in VIEW_OPS
            return func(*args, **(kwargs or {}))

    with CountOps():
        model.forward(session, tokens, parents)
    return CountOps.launches


def _time_forwards(ctx, model, session, tokens_list, repeats, compiled, out: dict) -> None:
    """`compiled`: (forward, its CompileStats) from compiled_forward, or None (the model's eager forward)."""
    forward, stats = compiled or (model.forward, None)
    dev = model.device
    codes = model.geometry.vocab_size
    g = torch.Generator(device=dev).manual_seed(0)
    last_first = 0.0
    for T in tokens_list:
        key = str(T)
        need = max(10.0, 1.1 * last_first) if compiled else 5.0  # a compile it cannot finish is not started
        if ctx.time_left() < need:
            out[key] = {"skipped": "stage budget spent"}
            continue
        tok = torch.randint(0, codes, (1, T), device=dev, generator=g)
        parents = list(range(-1, T - 1))
        try:
            before = compile_totals(stats)
            t = time.perf_counter()
            forward(session, tok, parents)  # compiled: compiles this shape
            sync(dev)
            first = time.perf_counter() - t
            for _ in range(2):  # CUDA graph trees: warm-up, then record; later calls replay
                forward(session, tok, parents)
            sync(dev)
            t = time.perf_counter()
            for _ in range(repeats):
                forward(session, tok, parents)
            sync(dev)
            row = {"forward_ms": 1e3 * (time.perf_counter() - t) / repeats, "first_call_s": round(first, 3)}
            if compiled:
                after = compile_totals(stats)
                row.update({k: after[k] - before[k] for k in ("compiles", "recompiles", "graph_breaks")})
                row["eager_fallback"] = after["eager_fallback"]
                last_first = first
        except Exception as e:  # noqa: BLE001
            row = {"error": error_text(e)}
        out[key] = row
        ctx.track_memory()
        ctx.save()


def stage_forward_7b(ctx) -> None:
    from ...model_loaders.contract import ImageGeometry
    from ...model_loaders.families.llama_adapter import IMAGE_OFFSET, LlamaImageModel, byte_text_encoder
    opt = ctx.options
    dev = torch.device(opt["device"])
    dtype = getattr(torch, opt["dtype_7b"])
    shape = SHAPES["small" if opt["dry_run"] else "chameleon-7b"]
    eager_tokens, compiled_tokens = opt["tokens_7b"], opt["compiled_tokens_7b"] if opt["compile"] else []
    capacity = max(eager_tokens + compiled_tokens)
    grid = shape["grid"]
    geometry = ImageGeometry(grid, grid, shape["image_codes"], row_end=True)
    t = time.perf_counter()
    dec = random_decoder(shape, dev, dtype, max_positions=geometry.seq_len + capacity + 256)
    sync(dev)
    model = LlamaImageModel(dec, geometry, byte_text_encoder(IMAGE_OFFSET + shape["image_codes"]), name=shape["name"])
    r = ctx.result
    r.update({"shape": {k: v for k, v in shape.items()}, "dtype": opt["dtype_7b"], "device": str(dev), "cfg_rows": 2,
              "build_s": round(time.perf_counter() - t, 2), "repeats": opt["repeats_7b"],
              "parameters": sum(p.numel() for p in dec.parameters()), "eager": {}, "compiled": {}})
    ctx.track_memory()
    ctx.save()
    # a 62-byte prompt: 64 tokens with BOS and BOI, the compiled sessions' prompt multiple, so that eager and
    # compiled forwards attend over the same number of cache slots
    enc = model.encode_prompt(("a photo of a cat on a sofa " * 3)[:62], "")
    committed = geometry.seq_len // 2  # a mid-image prefix: positions as in the middle of a generation
    from ..compile_rows import compiled_forward
    compiled = compiled_forward(model) if compiled_tokens else None
    with torch.inference_mode():
        for mode, tokens_list in (("eager", eager_tokens), ("compiled", compiled_tokens)):
            if not tokens_list:
                continue
            try:
                session = model.start(enc, 1, True, draft_capacity=capacity, captured=mode == "compiled")
                model.commit(session, None, torch.tensor([committed], device=dev))
                # attention runs over every slot of the static cache (masked): the KV length each forward reads
                r["kv_slots"] = session.state.S
                r.setdefault("kv_slots_by_mode", {})[mode] = session.state.S
                r["committed_prefix"] = committed
                if mode == "eager" and "launches" not in r:
                    r["launches"] = {str(T): _count_launches(model, session, torch.zeros(1, T, dtype=torch.long,
                                                                                           device=dev),
                                                             list(range(-1, T - 1))) for T in (1, capacity)}
                _time_forwards(ctx, model, session, tokens_list, opt["repeats_7b"],
                               compiled if mode == "compiled" else None, r[mode])
            except Exception as e:  # noqa: BLE001
                r[mode]["error"] = error_text(e)
            finally:
                session = None
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            ctx.save()
    if compiled is not None:
        r["compile_totals"] = compiled[1].to_dict()
    try:
        env = dict(ctx.previous.get("environment", {}).get("result", {}))
        if not env.get("device_name"):  # the environment stage failed or did not run: what the refit needs
            from ...cli.machine import cpu_name
            env["device_name"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
        if not env.get("peaks"):
            env["peaks"] = measured_peaks(dev, opt["dry_run"])
            r["peaks_measured_here"] = env["peaks"]
        from .refit import refit_roofline
        r["roofline_refit"] = refit_roofline(r, env, opt["bench_json"], dry_run=opt["dry_run"])
    except Exception as e:  # noqa: BLE001 -- the measurements stay recorded
        r["roofline_refit"] = {"error": error_text(e)}


__all__ = ["VIEW_OPS", "stage_forward_7b"]
