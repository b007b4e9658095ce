"""gpu-check's environment stage: versions, the device, the SDPA kernels that run our masked attention, a
compile smoke test, the compiled step's CUDA-graph failure mode in miniature, and this card's measured copy
bandwidth and matrix-product rate (the roofline refit's peaks for a card it has no datasheet for)."""
from __future__ import annotations

import contextlib
import time

import torch

from ..shapes import sync
from .records import counters, counters_diff, error_text


def _nvidia_smi() -> dict:
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return {"nvidia_smi": out.stdout.strip() or out.stderr.strip()[:300]}
    except (OSError, subprocess.SubprocessError) as e:
        return {"nvidia_smi": f"not run: {error_text(e)}"}


def _sdpa_kernels(device, dtype) -> dict:
    """Which SDPA kernels run (a) causal attention without a mask and (b) our attention: a
    boolean mask [R, 1, T, S] over a static cache, 2 CFG rows, 33 queries, 2048 keys."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    q = torch.randn(2, 8, 33, 64, device=device, dtype=dtype)
    k = torch.randn(2, 8, 2048, 64, device=device, dtype=dtype)
    v = torch.randn_like(k)
    mask = torch.rand(2, 1, 33, 2048, device=device) < 0.5
    mask[..., 0] = True
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            out[name] = "absent in this torch"
            continue
        row = {}
        for case, (kk, vv, kw) in (("causal", (q, q, dict(is_causal=True))), ("our_mask", (k, v, dict(attn_mask=mask)))):
            try:
                with sdpa_kernel([backend]):
                    torch.nn.functional.scaled_dot_product_attention(q, kk, vv, **kw)
                sync(device)
                row[case] = "runs"
            except Exception as e:  # noqa: BLE001 -- an unavailable kernel says why
                row[case] = error_text(e)[:160]
        out[name] = row
    if torch.device(device).type == "cuda":
        b = torch.backends.cuda
        out["enabled_flags"] = {n: bool(getattr(b, f"{n}_sdp_enabled", lambda: None)())
                                for n in ("flash", "mem_efficient", "math", "cudnn")}
    return out


def _compile_smoke(device) -> dict:
    """torch.compile of a two-op function with the compiled step's settings on this device, run
    four times (CUDA graph trees: warm-up, record, replay)."""
    from ...samplers.compiled_step.shape_compiled import compile_settings
    before = counters()
    t = time.perf_counter()
    fn = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1, fullgraph=True, dynamic=False,
                       **compile_settings(device))
    x = torch.randn(64, 64, device=device)
    want = torch.nn.functional.silu(x) * 2 + 1
    same = True
    for _ in range(4):
        same = same and bool(torch.allclose(fn(x), want, atol=1e-5))
    sync(device)
    return {"ok": same, "seconds": round(time.perf_counter() - t, 2), "settings": repr(compile_settings(device)),
            "counters": counters_diff(before, counters())}


def _cudagraph_probe(device) -> dict:
    """The compiled step's known CUDA-graph failure mode, in miniature: a step that writes into a cache
    it receives (as the model's step writes its KV cache), compiled with mode reduce-overhead under
    inference mode, once with the cache as a plain input and once with its address marked static
    (torch._dynamo.mark_static_address). Per variant: CUDA graphs skipped (inductor's counter; the
    reason is in the stage's torch log), results equal to eager's over four calls (warm-up, record,
    replays)."""
    def plain_step(cache, slot, x):
        cache[slot] = x
        return (cache * 2).sum(0)

    def static_step(cache, slot, x):  # the same step as its own code object: dynamo caches graphs per code object
        cache[slot] = x
        return (cache * 2).sum(0)

    from torch._inductor import config as inductor_config
    out = {}
    for variant, step in (("plain_input", plain_step), ("static_address", static_step)):
        # no cache hits: the first GPU run's static variant reused the plain variant's compiled graph (FX graph
        # and AOT caches key the same graph alike) with its CUDA-graph decision, and measured nothing
        caches_off = [inductor_config.patch(fx_graph_cache=False)]
        try:
            from torch._functorch import config as functorch_config
            caches_off.append(functorch_config.patch(enable_autograd_cache=False))
        except Exception:  # noqa: BLE001 -- older torch: no AOT autograd cache
            pass
        try:
            with contextlib.ExitStack() as stack, torch.inference_mode():
                for c in caches_off:
                    stack.enter_context(c)
                cache = torch.zeros(4, 16, device=device)
                if variant == "static_address":  # as the product marks its buffers
                    from ...model_loaders.capture import mark_static_addresses
                    mark_static_addresses([cache], device)
                want_cache = cache.clone()
                fn = torch.compile(step, fullgraph=True, dynamic=False, mode="reduce-overhead")
                before, t = counters(), time.perf_counter()
                same = True
                for i in range(4):
                    slot, x = torch.tensor([i], device=device), torch.full((1, 16), float(i + 1), device=device)
                    got = fn(cache, slot, x).clone()
                    same = same and bool(torch.equal(got, step(want_cache, slot, x)))
                same = same and bool(torch.equal(cache, want_cache))
                diff = counters_diff(before, counters())
            out[variant] = {"results_equal_eager": same, "seconds": round(time.perf_counter() - t, 2),
                            "cudagraph_skips": diff.get("inductor", {}).get("cudagraph_skips", 0), "counters": diff}
        except Exception as e:  # noqa: BLE001 -- the failure is the finding
            out[variant] = {"error": error_text(e)}
    return out


def measured_peaks(device, dry_run: bool) -> dict:
    """Measured peaks of this device: a device-to-device copy (bytes read + written per second)
    and a bf16 (CPU: float32) matrix product; the roofline refit uses them for a card it has no
    datasheet for."""
    dev = torch.device(device)
    n_bytes = (64 if dry_run else 2048) << 20
    size = 512 if dry_run else 8192
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(dev)
    reps = 3 if dry_run else 20
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(dev)
    bandwidth = 2 * n_bytes * reps / (time.perf_counter() - t)
    del src, dst
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    a @ b
    sync(dev)
    reps = 3 if dry_run else 10
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(dev)
    flops = 2 * size ** 3 * reps / (time.perf_counter() - t)
    return {"copy_bytes_per_s": bandwidth, "matmul_flops_per_s": flops, "matmul_dtype": str(dtype).replace("torch.", ""),
            "copy_mib": n_bytes >> 20, "matmul_size": size}


def stage_environment(ctx) -> None:
    import platform
    import sys

    from ...cli.machine import cpu_name
    dev = torch.device(ctx.options["device"])
    r = ctx.result
    r.update({"python": sys.version.split()[0], "platform": platform.platform(), "processor": cpu_name(),
              "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
              "device": str(dev)})
    try:
        import transformers
        r["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        r["transformers"] = f"not importable: {error_text(e)}"
    try:
        import triton
        r["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        r["triton"] = f"not importable: {error_text(e)}"
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        r.update({"device_name": p.name, "capability": f"{p.major}.{p.minor}", "memory_bytes": p.total_memory,
                  "multiprocessors": p.multi_processor_count, "bf16_supported": torch.cuda.is_bf16_supported(),
                  "cudnn": torch.backends.cudnn.version(), "device_count": torch.cuda.device_count()})
        try:
            get = getattr(torch._C, "_cuda_getDriverVersion", None)  # private API: absent in torch 2.11's build
            r["cuda_driver_api"] = get() if get is not None else "not in this torch build (nvidia_smi has the driver)"
        except Exception as e:  # noqa: BLE001 -- private API: absent in some builds
            r["cuda_driver_api"] = error_text(e)
        r.update(_nvidia_smi())
    else:
        r.update({"device_name": cpu_name(), "threads": torch.get_num_threads()})
    ctx.save()
    try:
        r["sdpa"] = _sdpa_kernels(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    except Exception as e:  # noqa: BLE001 -- recorded, the rest of the stage still runs
        r["sdpa"] = {"error": error_text(e)}
    ctx.track_memory()
    ctx.save()
    try:
        r["peaks"] = measured_peaks(dev, ctx.options["dry_run"])
    except Exception as e:  # noqa: BLE001
        r["peaks_error"] = error_text(e)
    ctx.track_memory()
    ctx.save()
    try:
        from torch import _dynamo
        r["dynamo_supported"] = bool(_dynamo.is_dynamo_supported())
        from torch._inductor import config as ic
        # the settings the known CUDA-graph failure modes depend on
        r["compile_config"] = {
            "recompile_limit": getattr(_dynamo.config, "recompile_limit", getattr(_dynamo.config, "cache_size_limit", None)),
            "automatic_dynamic_shapes": getattr(_dynamo.config, "automatic_dynamic_shapes", None),
            "cudagraph_trees": getattr(ic.triton, "cudagraph_trees", None),
            "cudagraph_skip_dynamic_graphs": getattr(ic.triton, "cudagraph_skip_dynamic_graphs", None),
            "cudagraph_support_input_mutation": getattr(ic.triton, "cudagraph_support_input_mutation", None),
            "compile_threads": getattr(ic, "compile_threads", None)}
    except Exception as e:  # noqa: BLE001
        r["dynamo_supported"] = error_text(e)
    if ctx.options["compile"]:
        try:
            r["compile_smoke"] = _compile_smoke(dev)
        except Exception as e:  # noqa: BLE001
            r["compile_smoke"] = {"ok": False, "error": error_text(e)}
        ctx.save()
        r["cudagraph_probe"] = _cudagraph_probe(dev)
    else:
        r["compile_smoke"] = {"ok": None, "skipped": "--no-compile"}
    ctx.track_memory()


__all__ = ["measured_peaks", "stage_environment"]
