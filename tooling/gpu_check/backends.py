"""gpu-check's backends stage: every registered backend eager vs compiled (the model's compiled step: CUDA graphs
on CUDA) on the demo model: latency and its ratio to AR's (written as each row finishes), forwards, compression,
compile time, graph breaks, recompiles, dynamo's counters, tokens equal to eager's."""
from __future__ import annotations

import time

import torch

from ...samplers.compiled_step.step_graphs import compile_stats
from .records import counters, counters_diff, error_text

DEMO_PROMPT = "a large red circle on a blue background"


def _demo_model(ctx):
    from ...model_loaders.tiny import tiny_model
    if ctx.options["dry_run"]:  # a tiny random-weight model (random-weight drafters for hawk / adt_tree / spatial)
        return tiny_model(16, (4, 4), seed=5, row_end=True, device=ctx.options["device"]), "tiny-v16-4x4 (dry run)"
    from ...model_loaders.registry import load_model
    return load_model("demo", device=ctx.options["device"], dtype=ctx.options["dtype"]), "demo"


def _run_stats(res, wall_s: float) -> dict:
    st = res.stats
    return {"latency_s": st.latency_s, "decode_s": st.decode_s, "wall_s": round(wall_s, 4), "forwards": st.nfe,
            "step_compression": st.step_compression, "peak_memory_bytes": st.peak_memory_bytes}


def _first_difference(a: torch.Tensor, b: torch.Tensor):
    diff = (a.reshape(-1) != b.reshape(-1)).nonzero()
    return None if diff.numel() == 0 else int(diff[0])


def ratios_to_ar(rows: dict, base: str) -> None:
    """Latency ratios to the base's (AR's) within each mode, on every row that has both: called as each row
    finishes, so that a stage cut for time keeps the ratios of what it measured."""
    for row in rows.values():
        for mode in ("eager", "compiled"):
            lat, ref = row.get(mode, {}).get("latency_s"), rows.get(base, {}).get(mode, {}).get("latency_s")
            if lat and ref:
                row[mode]["speedup_vs_ar"] = ref / lat


def stage_backends(ctx) -> None:
    """Every backend of the plan (options `backends`, AR first) eager, then those of `compile_backends` compiled."""
    from ...samplers.api import generate
    opt = ctx.options
    r = ctx.result
    t = time.perf_counter()
    model, label = _demo_model(ctx)
    dev = model.device
    r.update({"model": label, "device": str(dev), "dtype": str(next(model.torch_module().parameters()).dtype),
              "prompt": DEMO_PROMPT, "seed": opt["seed"], "load_s": round(time.perf_counter() - t, 2),
              "ratio_base": opt["ratio_base"], "rows": {}})
    rows = r["rows"]
    kw = dict(seed=opt["seed"])
    t = time.perf_counter()
    generate(model, DEMO_PROMPT, backend=opt["ratio_base"], **kw)  # the first generation (CUDA / BLAS set-up): untimed
    r["first_generation_s"] = round(time.perf_counter() - t, 2)
    ctx.track_memory()
    eager_tokens = {}
    for b in opt["backends"]:
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
            row["eager"] = {"error": error_text(e)}
        ratios_to_ar(rows, opt["ratio_base"])
        ctx.track_memory()
        ctx.save()
    # the dry run takes the CUDA-graph path's buffer handling on the CPU too (static marks, output copies, buffer
    # homes: compiled.GRAPH_BUFFERS_ON_CPU), so that the command checks the code a GPU runs
    from ...model_loaders import capture as capture_mod
    graph_buffers_before = capture_mod.GRAPH_BUFFERS_ON_CPU
    capture_mod.GRAPH_BUFFERS_ON_CPU = graph_buffers_before or opt["dry_run"]
    try:
        _compiled_rows(ctx, model, opt["compile_backends"] if opt["compile"] else [], rows, eager_tokens, kw)
    finally:
        capture_mod.GRAPH_BUFFERS_ON_CPU = graph_buffers_before


def _compiled_rows(ctx, model, compiled: list, rows: dict, eager_tokens: dict, kw: dict) -> None:
    """Each backend of `compiled`: a first compiled generation (compiles and records), a second (replays)."""
    from ...samplers.api import generate
    last_compile = 0.0
    for b in compiled:
        row = rows.setdefault(b, {"backend": b})
        if ctx.time_left() < max(15.0, 1.5 * last_compile):  # a compile it probably cannot finish: not started
            row["compiled"] = {"skipped": "stage budget spent"}
            continue
        row["compiled"] = {"skipped": "cut by the stage's budget while compiling"}  # what a kill leaves
        ctx.save()
        before, stats_before = counters(), compile_totals(compile_stats(model))
        try:
            t = time.perf_counter()
            # compiles (and records the graphs)
            first = generate(model, DEMO_PROMPT, backend=b, options=dict(compile=True), **kw)
            first_s = time.perf_counter() - t
            ctx.track_memory()  # the next generation resets CUDA's peak counter
            rerecords = ctx.log.count("Re-recording")
            t = time.perf_counter()
            res = generate(model, DEMO_PROMPT, backend=b, options=dict(compile=True), **kw)  # replays the graphs
            out = _run_stats(res, time.perf_counter() - t)
            # buffer homes (samplers/compiled_step/graph_buffers.py): the second generation's buffers move into the first's
            # addresses, so its graphs replay without recording again (run 2 of the first H200 session: x255 for AR)
            out["rerecords_replay"] = ctx.log.count("Re-recording") - rerecords
            out["buffers_rehomed"] = (res.stats.compile or {}).get("buffers_rehomed")
            totals = compile_totals(compile_stats(model))
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
                # an adaptive backend (one that reports its choices) picks its steps from what it measured during
                # the generation: its two runs need not take the same steps, nor give the same tokens
                out["tokens_compared"] = res.stats.backend_report is None
            e_lat = row.get("eager", {}).get("latency_s")
            out["speedup_vs_eager"] = e_lat / out["latency_s"] if e_lat else None
        except Exception as e:  # noqa: BLE001
            out = {"error": error_text(e)}
        out["counters"] = counters_diff(before, counters())
        row["compiled"] = out
        ratios_to_ar(rows, ctx.options["ratio_base"])
        ctx.track_memory()
        ctx.save()


def compile_totals(stats) -> dict:
    """The counters of a CompileStats (None: zeros)."""
    d = stats.to_dict() if stats is not None else {}
    return {"compiles": d.get("compiles", 0), "recompiles": d.get("recompiles", 0),
            "graph_breaks": d.get("graph_breaks", 0), "compile_s": d.get("compile_s", 0.0),
            "eager_fallback": d.get("eager_fallback", "")}


__all__ = ["DEMO_PROMPT", "compile_totals", "ratios_to_ar", "stage_backends"]
