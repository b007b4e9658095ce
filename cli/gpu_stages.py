"""The stages of `python -m specar gpu-check` (cli/gpu_check.py runs them, each isolated).

Each stage is a function of a `StageContext`: it reads the run's options from ``ctx.options``,
writes what it measured into ``ctx.result`` as it goes (``ctx.save()`` after each item, so a
stage cut for time still leaves what it finished), asks ``ctx.time_left()`` before starting
an item it may not finish, and calls ``ctx.track_memory()`` after each piece of device work
(the engine resets CUDA's peak counter at each generation, so the stage's peak is the maximum of
these readings).

- environment: versions, the device, SDPA kernels that run our masked attention, a compile
  smoke test, copy bandwidth and a bf16 matrix product (the measured peaks of this card);
- exactness: chi-square of ar / scd / sjd_pac / hawk / adt_tree against exact enumeration on
  tiny models on the device, and one planted bug that the same test must catch;
- backends: every backend eager vs compiled (the model's compiled step: CUDA graphs on CUDA) on
  the demo model: latency, forwards, compression, compile time, graph breaks, recompiles,
  dynamo's counters, tokens equal to eager's;
- forward_7b: forward latency of a random-weight Lumina-mGPT-7B-shape model (bf16, built on the
  device) for 1..65 tokens x 2 CFG rows over a full static KV cache, eager and compiled, and the
  roofline projection re-fitted to them (cli/gpu_refit.py).
"""
from __future__ import annotations

import contextlib
import time

import torch

# the compiled tokens of the 7B shape, in the order they are compiled while the stage has time
# (each is its own static graph, compiled in tens of seconds on a GPU)
COMPILED_TOKENS_7B = [1, 33, 65, 17, 9, 2, 49, 5]
# backends in the order the compiled runs go while the stage has time (the eager runs come first): AR (every
# ratio's base), then those no GPU has run compiled yet (auto, the default backend, slow in the first H200
# session; adt_tree and spatial, cut by the stage's budget there), then those measured there
BACKEND_ORDER = ["ar", "auto", "adt_tree", "spatial", "scd", "sjd_pac", "hawk", "sjd"]
# backends whose tokens depend on measured timings (auto picks windows from calibrated costs)
TIMING_DEPENDENT = {"auto"}
DEMO_PROMPT = "a large red circle on a blue background"

# aten ops that only make a new view of a tensor: no kernel is launched for them (as tests/test_roofline.py)
VIEW_OPS = {"view", "_unsafe_view", "reshape", "expand", "transpose", "permute", "slice", "select", "unsqueeze",
            "squeeze", "t", "alias", "detach", "as_strided", "split", "unbind", "narrow", "lift_fresh", "empty"}


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:400] if text else ''}"


def _counters() -> dict:
    """torch._dynamo.utils.counters as plain dicts (graph breaks by reason, recompiles, cudagraph
    skips, unique graphs, ...)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 -- a torch without dynamo
        return {}
    return {str(k): {str(kk): vv for kk, vv in v.items()} for k, v in counters.items() if v}


def counters_diff(before: dict, after: dict) -> dict:
    out = {}
    for group, items in after.items():
        diff = {k: v - before.get(group, {}).get(k, 0) for k, v in items.items()}
        diff = {k: v for k, v in diff.items() if v}
        if diff:
            out[group] = diff
    return out


# ---------------------------------------------------------------------------------------------
# stage 0: environment


def _nvidia_smi() -> dict:
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return {"nvidia_smi": out.stdout.strip() or out.stderr.strip()[:300]}
    except (OSError, subprocess.SubprocessError) as e:
        return {"nvidia_smi": f"not run: {_error(e)}"}


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
                _sync(device)
                row[case] = "runs"
            except Exception as e:  # noqa: BLE001 -- an unavailable kernel says why
                row[case] = _error(e)[:160]
        out[name] = row
    if torch.device(device).type == "cuda":
        b = torch.backends.cuda
        out["enabled_flags"] = {n: bool(getattr(b, f"{n}_sdp_enabled", lambda: None)())
                                for n in ("flash", "mem_efficient", "math", "cudnn")}
    return out


def _compile_smoke(device) -> dict:
    """torch.compile of a two-op function with the compiled step's settings on this device, run
    four times (CUDA graph trees: warm-up, record, replay)."""
    from ..samplers.compiled_step.shape_compiled import compile_settings
    before = _counters()
    t = time.perf_counter()
    fn = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1, fullgraph=True, dynamic=False,
                       **compile_settings(device))
    x = torch.randn(64, 64, device=device)
    want = torch.nn.functional.silu(x) * 2 + 1
    same = True
    for _ in range(4):
        same = same and bool(torch.allclose(fn(x), want, atol=1e-5))
    _sync(device)
    return {"ok": same, "seconds": round(time.perf_counter() - t, 2), "settings": repr(compile_settings(device)),
            "counters": counters_diff(before, _counters())}


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
                    from ..model_loaders.capture import mark_static_addresses
                    mark_static_addresses([cache], device)
                want_cache = cache.clone()
                fn = torch.compile(step, fullgraph=True, dynamic=False, mode="reduce-overhead")
                before, t = _counters(), time.perf_counter()
                same = True
                for i in range(4):
                    slot, x = torch.tensor([i], device=device), torch.full((1, 16), float(i + 1), device=device)
                    got = fn(cache, slot, x).clone()
                    same = same and bool(torch.equal(got, step(want_cache, slot, x)))
                same = same and bool(torch.equal(cache, want_cache))
                diff = counters_diff(before, _counters())
            out[variant] = {"results_equal_eager": same, "seconds": round(time.perf_counter() - t, 2),
                            "cudagraph_skips": diff.get("inductor", {}).get("cudagraph_skips", 0), "counters": diff}
        except Exception as e:  # noqa: BLE001 -- the failure is the finding
            out[variant] = {"error": _error(e)}
    return out


def _peaks(device, dry_run: bool) -> dict:
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
    _sync(dev)
    reps = 3 if dry_run else 20
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    _sync(dev)
    bandwidth = 2 * n_bytes * reps / (time.perf_counter() - t)
    del src, dst
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    a @ b
    _sync(dev)
    reps = 3 if dry_run else 10
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(dev)
    flops = 2 * size ** 3 * reps / (time.perf_counter() - t)
    return {"copy_bytes_per_s": bandwidth, "matmul_flops_per_s": flops, "matmul_dtype": str(dtype).replace("torch.", ""),
            "copy_mib": n_bytes >> 20, "matmul_size": size}


def stage_environment(ctx) -> None:
    import platform
    import sys

    from .benchmark import cpu_name
    dev = torch.device(ctx.options["device"])
    r = ctx.result
    r.update({"python": sys.version.split()[0], "platform": platform.platform(), "processor": cpu_name(),
              "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
              "device": str(dev)})
    try:
        import transformers
        r["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        r["transformers"] = f"not importable: {_error(e)}"
    try:
        import triton
        r["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        r["triton"] = f"not importable: {_error(e)}"
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        r.update({"device_name": p.name, "capability": f"{p.major}.{p.minor}", "memory_bytes": p.total_memory,
                  "multiprocessors": p.multi_processor_count, "bf16_supported": torch.cuda.is_bf16_supported(),
                  "cudnn": torch.backends.cudnn.version(), "device_count": torch.cuda.device_count()})
        try:
            get = getattr(torch._C, "_cuda_getDriverVersion", None)  # private API: absent in torch 2.11's build
            r["cuda_driver_api"] = get() if get is not None else "not in this torch build (nvidia_smi has the driver)"
        except Exception as e:  # noqa: BLE001 -- private API: absent in some builds
            r["cuda_driver_api"] = _error(e)
        r.update(_nvidia_smi())
    else:
        r.update({"device_name": cpu_name(), "threads": torch.get_num_threads()})
    ctx.save()
    try:
        r["sdpa"] = _sdpa_kernels(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    except Exception as e:  # noqa: BLE001 -- recorded, the rest of the stage still runs
        r["sdpa"] = {"error": _error(e)}
    ctx.track_memory()
    ctx.save()
    try:
        r["peaks"] = _peaks(dev, ctx.options["dry_run"])
    except Exception as e:  # noqa: BLE001
        r["peaks_error"] = _error(e)
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
        r["dynamo_supported"] = _error(e)
    if ctx.options["compile"]:
        try:
            r["compile_smoke"] = _compile_smoke(dev)
        except Exception as e:  # noqa: BLE001
            r["compile_smoke"] = {"ok": False, "error": _error(e)}
        ctx.save()
        r["cudagraph_probe"] = _cudagraph_probe(dev)
    else:
        r["compile_smoke"] = {"ok": None, "skipped": "--no-compile"}
    ctx.track_memory()


# ---------------------------------------------------------------------------------------------
# stage 1: exactness on the device

# (backend, params, model, setting): one case per backend, from the CPU suite's cases, in each backend's own
# rejection sampling (reproducible=False: the rule the planted bug breaks), then one case of the default
# "same image as AR" mode (verification by agreement with the position-keyed noise)
EXACTNESS_CASES = [
    ("ar", {}, "v3-2x3-rowend", "cfg"),
    ("scd", dict(window=16, init="sample_above", coupling="gumbel"), "v4-2x2", "mixed"),
    ("sjd_pac", dict(window=16, tree_depth=3, tree_width=3), "v3-2x3-rowend", "topk"),
    ("hawk", dict(vertical_depth=1, candidates=2, node_budget=12), "v3-2x2", "cfg"),
    ("adt_tree", {}, "v3-2x3-rowend", "mixed"),
    ("sjd_pac", dict(window=16, tree_depth=3, tree_width=3, reproducible=True), "v3-2x3-rowend", "topk"),
]
# the same test must catch a planted bug at the same sample count (tests/test_exactness.py's wrong residual)
PLANTED_CASE = ("sjd", dict(window=3, init="repeat_left"), "v3-2x2", "plain")
# per case; 6 cases: a correct sampler fails the stage with probability < 6e-5 (< 1e-4)
EXACTNESS_P_FAIL = 1e-5


def _chi_square_case(device, backend, params, model_name, setting, n, seed, models) -> dict:
    from ..samplers.api import generate
    from ..testing import EXACTNESS_MODELS, EXACTNESS_SETTINGS, chi_square_test, exact_distribution, tiny_model
    if model_name not in models:
        models[model_name] = tiny_model(**EXACTNESS_MODELS[model_name], device=str(device))
    mdl = models[model_name]
    kw = EXACTNESS_SETTINGS[setting]
    t = time.perf_counter()
    params = {"reproducible": False, **params}  # a case says when it is the agreement mode
    res = generate(mdl, "hi", backend=backend, seed=seed, batch_size=n, **kw, **params)
    p_value, stat, dof, tv = chi_square_test(res.tokens, exact_distribution(mdl, "hi", **kw))
    return {"backend": backend, "params": params, "model": model_name, "setting": setting, "samples": n,
            "p_value": p_value, "chi2": stat, "dof": dof, "total_variation": tv,
            "step_compression": res.stats.step_compression, "seconds": round(time.perf_counter() - t, 2)}


def stage_exactness(ctx) -> None:
    from ..samplers import verify as verify_mod
    dev = torch.device(ctx.options["device"])
    n, seed = ctx.options["samples"], 1234
    r = ctx.result
    r.update({"samples": n, "p_fail": EXACTNESS_P_FAIL, "device": str(dev), "dtype": "float32", "cases": []})
    models: dict = {}
    for backend, params, m, s in EXACTNESS_CASES:
        if ctx.time_left() < 5:
            r["cases"].append({"backend": backend, "skipped": "stage budget spent"})
            continue
        try:
            case = _chi_square_case(dev, backend, params, m, s, n, seed, models)
            case["passed"] = case["p_value"] > EXACTNESS_P_FAIL
        except Exception as e:  # noqa: BLE001 -- one backend's failure must not hide the others'
            case = {"backend": backend, "params": params, "model": m, "setting": s, "error": _error(e), "passed": False}
        r["cases"].append(case)
        ctx.track_memory()
        ctx.save()
    backend, params, m, s = PLANTED_CASE
    if ctx.time_left() > 5:
        real = verify_mod.residual
        verify_mod.residual = lambda p, q: p  # planted bug: resample from p instead of norm(max(0, p - q))
        try:
            case = _chi_square_case(dev, backend, params, m, s, n, seed, models)
            case["caught"] = case["p_value"] < EXACTNESS_P_FAIL
        except Exception as e:  # noqa: BLE001
            case = {"backend": backend, "error": _error(e), "caught": False}
        finally:
            verify_mod.residual = real
        r["planted_wrong_residual"] = case
    ran = [c for c in r["cases"] if "skipped" not in c]
    r["all_passed"] = bool(ran) and len(ran) == len(EXACTNESS_CASES) and all(c["passed"] for c in ran)
    ctx.track_memory()


# ---------------------------------------------------------------------------------------------
# stage 2: every backend eager vs compiled on the demo model


def _demo_model(ctx):
    from ..testing import tiny_model
    if ctx.options["dry_run"]:  # a tiny random-weight model (random-weight drafters for hawk / adt_tree / spatial)
        return tiny_model(16, (4, 4), seed=5, row_end=True, device=ctx.options["device"]), "tiny-v16-4x4 (dry run)"
    from ..model_loaders.registry import load_model
    return load_model("demo", device=ctx.options["device"], dtype=ctx.options["dtype"]), "demo"


def _run_stats(res, wall_s: float) -> dict:
    st = res.stats
    return {"latency_s": st.latency_s, "decode_s": st.decode_s, "wall_s": round(wall_s, 4), "forwards": st.nfe,
            "step_compression": st.step_compression, "peak_memory_bytes": st.peak_memory_bytes}


def _first_difference(a: torch.Tensor, b: torch.Tensor):
    diff = (a.reshape(-1) != b.reshape(-1)).nonzero()
    return None if diff.numel() == 0 else int(diff[0])


def stage_backends(ctx) -> None:
    from ..samplers.api import generate
    from ..samplers.backends import SCHEMAS
    opt = ctx.options
    model, label = _demo_model(ctx)
    dev = model.device
    r = ctx.result
    backends = [b for b in BACKEND_ORDER if b in SCHEMAS] + [b for b in SCHEMAS if b not in BACKEND_ORDER]
    if opt.get("backends"):  # checked against SCHEMAS by gpu_check.options_from_args
        backends = list(opt["backends"])
    compiled = [b for b in backends if b in opt["compile_backends"]] if opt["compile"] else []
    r.update({"model": label, "device": str(dev), "dtype": str(next(model.torch_module().parameters()).dtype),
              "prompt": DEMO_PROMPT, "seed": opt["seed"], "rows": {}})
    rows = r["rows"]
    kw = dict(seed=opt["seed"])
    t = time.perf_counter()
    generate(model, DEMO_PROMPT, backend="ar", **kw)  # the process's first generation (CUDA / BLAS set-up): untimed
    r["first_generation_s"] = round(time.perf_counter() - t, 2)
    ctx.track_memory()
    eager_tokens = {}
    for b in backends:
        row = rows.setdefault(b, {"backend": b})
        if ctx.time_left() < 10:
            row["eager"] = {"skipped": "stage budget spent"}
            continue
        try:
            t = time.perf_counter()
            res = generate(model, DEMO_PROMPT, backend=b, **kw)
            row["eager"] = _run_stats(res, time.perf_counter() - t)
            eager_tokens[b] = res.tokens
        except Exception as e:  # noqa: BLE001
            row["eager"] = {"error": _error(e)}
        ctx.track_memory()
        ctx.save()
    # the dry run takes the CUDA-graph path's buffer handling on the CPU too (static marks, output copies, buffer
    # homes: capture.GRAPH_BUFFERS_ON_CPU), so that the command checks the code a GPU runs
    from ..model_loaders import capture as capture_mod
    graph_buffers_before = capture_mod.GRAPH_BUFFERS_ON_CPU
    capture_mod.GRAPH_BUFFERS_ON_CPU = graph_buffers_before or opt["dry_run"]
    try:
        _compiled_rows(ctx, model, compiled, rows, eager_tokens, kw)
    finally:
        capture_mod.GRAPH_BUFFERS_ON_CPU = graph_buffers_before
    ar = rows.get("ar", {})
    for b, row in rows.items():  # latency ratios to AR within each mode
        for mode in ("eager", "compiled"):
            lat, base = row.get(mode, {}).get("latency_s"), ar.get(mode, {}).get("latency_s")
            if lat and base:
                row[mode]["speedup_vs_ar"] = base / lat


def _compiled_rows(ctx, model, compiled: list, rows: dict, eager_tokens: dict, kw: dict) -> None:
    """Each backend of `compiled`: a first compiled generation (compiles and records), a second (replays)."""
    from ..samplers.api import generate
    from ..samplers.compiled_step.step_graphs import compile_stats
    last_compile = 0.0
    for b in compiled:
        row = rows[b]
        if ctx.time_left() < max(15.0, 1.5 * last_compile):  # a compile it probably cannot finish: not started
            row["compiled"] = {"skipped": "stage budget spent"}
            continue
        before, stats_before = _counters(), _compile_totals(compile_stats(model))
        try:
            t = time.perf_counter()
            first = generate(model, DEMO_PROMPT, backend=b, compile=True, **kw)  # compiles (and records the graphs)
            first_s = time.perf_counter() - t
            ctx.track_memory()  # the next generation resets CUDA's peak counter
            rerecords = ctx.log.count("Re-recording")
            t = time.perf_counter()
            res = generate(model, DEMO_PROMPT, backend=b, compile=True, **kw)  # replays
            out = _run_stats(res, time.perf_counter() - t)
            # buffer homes (samplers/compiled_step/graph_buffers.py): the second generation's buffers move into the
            # first's addresses, so its graphs replay without recording again (run 2 of the first H200 session: x255
            # for AR)
            out["rerecords_replay"] = ctx.log.count("Re-recording") - rerecords
            out["buffers_rehomed"] = (res.stats.compile or {}).get("buffers_rehomed")
            totals = _compile_totals(compile_stats(model))
            out.update({"first_run_s": round(first_s, 2),
                        **{k: totals[k] - stats_before[k] for k in ("compiles", "recompiles", "graph_breaks")},
                        "compile_s": round(totals["compile_s"] - stats_before["compile_s"], 2),
                        "eager_fallback": totals["eager_fallback"],
                        "replay_tokens_equal_first_run": bool(torch.equal(first.tokens, res.tokens))})
            last_compile = first_s
            if b in eager_tokens:
                out["tokens_equal_eager"] = bool(torch.equal(res.tokens, eager_tokens[b]))
                out["first_difference_at"] = _first_difference(res.tokens, eager_tokens[b])
                out["tokens_differing"] = int((res.tokens != eager_tokens[b]).sum())
                out["tokens_compared"] = b not in TIMING_DEPENDENT
            e_lat = row.get("eager", {}).get("latency_s")
            out["speedup_vs_eager"] = e_lat / out["latency_s"] if e_lat else None
        except Exception as e:  # noqa: BLE001
            out = {"error": _error(e)}
        out["counters"] = counters_diff(before, _counters())
        row["compiled"] = out
        ctx.track_memory()
        ctx.save()


def _compile_totals(stats) -> dict:
    d = stats.to_dict() if stats is not None else {}
    return {"compiles": d.get("compiles", 0), "recompiles": d.get("recompiles", 0),
            "graph_breaks": d.get("graph_breaks", 0), "compile_s": d.get("compile_s", 0.0),
            "eager_fallback": d.get("eager_fallback", "")}


# ---------------------------------------------------------------------------------------------
# stage 3: the 7B shape's forward, and the roofline refit

SHAPE_7B = dict(name="Lumina-mGPT 7B shape (random weights)", vocab_size=65536, hidden_size=4096, num_layers=32,
                num_heads=32, intermediate_size=11008, image_codes=8192, grid=48)
SHAPE_DRY = dict(name="tiny Llama (dry run)", vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4,
                 intermediate_size=176, image_codes=1024, grid=8)


def build_decoder(shape: dict, device, dtype, max_positions: int):
    """A random-weight LlamaDecoder allocated directly on `device` in `dtype` (no float32 copy of
    the 7B weights, no file)."""
    from ..model_loaders.llama import LlamaConfig, LlamaDecoder, rope_tables
    cfg = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                      num_layers=shape["num_layers"], num_heads=shape["num_heads"],
                      intermediate_size=shape["intermediate_size"], max_positions=max_positions)
    with torch.device("meta"):
        dec = LlamaDecoder(cfg)
    dec = dec.to(dtype=dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for _, prm in dec.named_parameters():
            if prm.dim() == 1:
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, prm.shape[-1] ** -0.5, generator=g)
        cos, sin = rope_tables(cfg, device)
        dec.rope_cos, dec.rope_sin = cos.to(dtype), sin.to(dtype)  # as load_model's .to(dtype) leaves them
    return dec.eval()


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
            before = _compile_totals(stats)
            t = time.perf_counter()
            forward(session, tok, parents)  # compiled: compiles this shape
            _sync(dev)
            first = time.perf_counter() - t
            for _ in range(2):  # CUDA graph trees: warm-up, then record; later calls replay
                forward(session, tok, parents)
            _sync(dev)
            t = time.perf_counter()
            for _ in range(repeats):
                forward(session, tok, parents)
            _sync(dev)
            row = {"forward_ms": 1e3 * (time.perf_counter() - t) / repeats, "first_call_s": round(first, 3)}
            if compiled:
                after = _compile_totals(stats)
                row.update({k: after[k] - before[k] for k in ("compiles", "recompiles", "graph_breaks")})
                row["eager_fallback"] = after["eager_fallback"]
                last_first = first
        except Exception as e:  # noqa: BLE001
            row = {"error": _error(e)}
        out[key] = row
        ctx.track_memory()
        ctx.save()


def stage_forward_7b(ctx) -> None:
    from ..model_loaders.contract import ImageGeometry
    from ..model_loaders.llama_adapter import IMAGE_OFFSET, LlamaImageModel, byte_text_encoder
    opt = ctx.options
    dev = torch.device(opt["device"])
    dtype = getattr(torch, opt["dtype_7b"])
    shape = SHAPE_DRY if opt["dry_run"] else SHAPE_7B
    eager_tokens, compiled_tokens = opt["tokens_7b"], opt["compiled_tokens_7b"] if opt["compile"] else []
    capacity = max(eager_tokens + compiled_tokens)
    grid = shape["grid"]
    geometry = ImageGeometry(grid, grid, shape["image_codes"], row_end=True)
    t = time.perf_counter()
    dec = build_decoder(shape, dev, dtype, max_positions=geometry.seq_len + capacity + 256)
    _sync(dev)
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
    from ..samplers.compiled_step.shape_compiled import compiled_forward
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
                r[mode]["error"] = _error(e)
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
            from .benchmark import cpu_name
            env["device_name"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
        if not env.get("peaks"):
            env["peaks"] = _peaks(dev, opt["dry_run"])
            r["peaks_measured_here"] = env["peaks"]
        from .gpu_refit import refit_roofline
        r["roofline_refit"] = refit_roofline(r, env, opt["bench_json"], dry_run=opt["dry_run"])
    except Exception as e:  # noqa: BLE001 -- the measurements stay recorded
        r["roofline_refit"] = {"error": _error(e)}


STAGES = {
    "environment": stage_environment,
    "exactness": stage_exactness,
    "backends": stage_backends,
    "forward_7b": stage_forward_7b,
}

__all__ = ["STAGES", "build_decoder", "counters_diff"]
