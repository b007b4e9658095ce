"""gpu-check's images stage: generations at the released models' shapes (tooling/released_models.py, random weights
in bf16 built in memory by each family's own classes, loaded through its loader), per backend of the registry: AR
eager first, then every backend eager, then those of `image_compile_backends` compiled (a first generation compiles
and records, the second is timed).

Each run: the seconds of a whole image, or of its first `image_rows` rows where a whole image does not fit the
lease (stated in the row: `positions`, `whole_image`; GLM-Image: its preview grid, then its image grid, each grid's
record in `grids`, tokens only: no DiT); ms per step (median, p90); compiled: compile seconds,
recompiles, graph breaks and CUDA-graph re-recordings and skips inside the timed run (expected 0); peak device
memory (None on the CPU); the tokens against AR's in the default same-image mode (tokens differing, first
difference), with the batch-invariant mode as the product sets it on this device, and for `image_invariant_backends`
once more with it flipped (on CUDA: forced on; on the CPU in bf16: forced off); then for `image_pinned_backends`
with every forward pinned at the backend's verify width against AR padded to it (`_pinned`), ms per step of both.
Ratios to AR are written as each row finishes (backends.ratios_to_ar), so that a stage cut for time keeps them."""
from __future__ import annotations

import tempfile
import time

import torch

from ...samplers.compiled_step.step_graphs import compile_stats
from ..released_models import RELEASED, build_released
from .backends import compile_totals, ratios_to_ar
from .records import error_text
from .timed_generation import compare_tokens, timed_generation

PROMPT = "a red fox in the snow"
SKIP_MESSAGE = "skipping cudagraphs"  # CUDA graph trees' message when a graph cannot be captured (runner.LogCapture)


def _before(model) -> int:
    """Positions sampled before the image's grid: a two-grid model's preceding grid (GLM-Image's preview), else 0."""
    first = model.preceding_stage()
    return 0 if first is None else first.geometry.seq_len


def _limit(model, rows, cap=None) -> int:
    """Positions of the first `rows` rows (row ends included; None: the whole image; a two-grid model: rows in the
    order sampled, its preceding grid's then the image's), at most `cap` (the dry run's few positions: the KV cache
    and every shape are still the whole image's)."""
    first = model.preceding_stage()
    n = 0
    for geo in ([] if first is None else [first.geometry]) + [model.geometry]:
        take = geo.height if rows is None else min(geo.height, rows)
        n += take * (geo.width + int(geo.row_end))
        rows = None if rows is None else rows - take
    return n if cap is None else min(n, cap)


def _backend(name: str, presets: dict):
    from ...samplers.backends import make_backend
    return make_backend(name, presets.get(name, "default"))


def _run(ctx, model, backend, limit, ref, compile=False, invariant=None, pin_width=None) -> tuple:
    """(tokens, record) of one timed generation, its tokens compared with `ref` (AR's) where given."""
    before, rerec, skips = compile_totals(compile_stats(model)), ctx.log.count("Re-recording"), ctx.log.count(
        SKIP_MESSAGE)
    tokens, rec = timed_generation(model, PROMPT, backend, limit, seed=ctx.options["seed"], compile=compile,
                                   invariant=invariant, pin_width=pin_width)
    rec["latency_s"] = rec["seconds"]  # what ratios_to_ar reads
    if compile:
        after = compile_totals(compile_stats(model))
        rec.update({k: after[k] - before[k] for k in ("compiles", "recompiles", "graph_breaks")},
                   rerecords=ctx.log.count("Re-recording") - rerec, cudagraph_skips=ctx.log.count(SKIP_MESSAGE) - skips,
                   eager_fallback=after["eager_fallback"])
    if ref is not None:
        rec["vs_ar"] = compare_tokens(tokens, ref)
    ctx.track_memory()
    return tokens, rec


def _family(ctx, name: str, fam: dict, workdir: str) -> None:
    opt = ctx.options
    dry = opt["dry_run"]
    t = time.perf_counter()
    model, info = build_released(name, workdir, opt["device"], torch.bfloat16, tiny=dry,
                                 saved=opt["image_weights"] == "saved")
    fam.update(model=info, build_s=round(time.perf_counter() - t, 2), prompt=PROMPT,
               sampling=dict(model.default_sampling), rows={})
    rows_asked = opt["image_rows"].get(name)
    cap = opt.get("image_positions_cap")
    limit = _limit(model, rows_asked, cap)
    total = model.geometry.seq_len + _before(model)
    fam["timed"] = ("the whole image" if limit == total else
                    f"the first {limit} of {total} positions" + (
                        f" ({rows_asked} rows)" if limit == _limit(model, rows_asked) else " (dry run)"))
    ctx.track_memory()
    ctx.save()
    presets, base = opt["image_presets"], opt["ratio_base"]
    t = time.perf_counter()
    timed_generation(model, PROMPT, base, min(limit, _before(model) + model.geometry.width), seed=opt["seed"])  # set-up
    fam["first_generation_s"] = round(time.perf_counter() - t, 2)
    rows, ref, ref_other = fam["rows"], None, None
    inv_limit = _limit(model, opt["image_invariant_rows"], cap)
    limited = name in opt["image_family_backends"]  # AR and the default backend eager only
    for b in opt["image_family_backends"].get(name, opt["image_backends"]):
        row = rows.setdefault(b, {"backend": b, "preset": presets.get(b, "default")})
        for mode, lim, flip in (("eager", limit, None), ("eager_invariant_flipped", inv_limit, True)):
            if flip and (limited or b not in opt["image_invariant_backends"]):
                continue
            if ctx.time_left() < 10:
                row[mode] = {"skipped": "stage budget spent"}
                continue
            invariant = None
            if flip:  # the other side of the product's choice on this device
                from ...model_loaders.precision import batch_invariant as bi
                invariant = bi.target_forward_mode(model, True)[1] != bi.SameImage.BATCH_INVARIANT
            try:
                tokens, rec = _run(ctx, model, _backend(b, presets), lim, ref_other if flip else ref,
                                   invariant=invariant)
                if b == base:
                    ref_other, ref = (tokens, ref) if flip else (ref_other, tokens)
                row[mode] = rec
            except Exception as e:  # noqa: BLE001
                row[mode] = {"error": error_text(e)}
            ratios_to_ar(rows, base)
            ctx.save()
    if name in opt["image_pinned_families"] and not limited:
        _pinned(ctx, model, fam, inv_limit)
    if not limited:
        _compiled(ctx, model, rows, limit, ref)
    else:
        fam["only"] = f"{', '.join(rows)} eager (the default run's share of the lease; --image-families {name}: all)"
    peaks = [run.get("peak_memory_bytes") for row in rows.values() for run in row.values() if isinstance(run, dict)]
    fam["peak_memory_bytes"] = max((p for p in peaks if p is not None), default=None)  # the family's largest run


def _pinned(ctx, model, fam: dict, limit: int) -> None:
    """Shape pinning (model_loaders/precision/batch_invariant.py): each backend of `image_pinned_backends` with every
    forward at its verify width, against AR padded to that width (one AR run per width, in ``fam["ar_pinned"]``),
    over `limit` positions; its tokens and ms per step beside the unpinned run's (``eager``)."""
    opt, presets = ctx.options, ctx.options["image_presets"]
    refs, ar_runs = {}, fam.setdefault("ar_pinned", {})
    for b in opt["image_pinned_backends"]:
        row = fam["rows"].setdefault(b, {"backend": b})
        if ctx.time_left() < 10:
            row["eager_pinned"] = {"skipped": "stage budget spent"}
            continue
        try:
            backend = _backend(b, presets)
            width = backend.verify_width(model)
            if width not in refs:
                refs[width], ar_runs[str(width)] = _run(ctx, model, _backend(opt["ratio_base"], presets), limit, None,
                                                        pin_width=width)
            _, rec = _run(ctx, model, backend, limit, refs[width], pin_width=width)
            rec["ar_step_ms_median"] = ar_runs[str(width)]["step_ms_median"]
            row["eager_pinned"] = rec
        except Exception as e:  # noqa: BLE001
            row["eager_pinned"] = {"error": error_text(e)}
        ctx.save()


def _compiled(ctx, model, rows: dict, limit: int, ref) -> None:
    opt = ctx.options
    from ...model_loaders import capture as capture_mod
    before = capture_mod.GRAPH_BUFFERS_ON_CPU  # the dry run takes the CUDA-graph path's buffer handling (backends.py)
    capture_mod.GRAPH_BUFFERS_ON_CPU = before or opt["dry_run"]
    last = 0.0
    try:
        for b in opt["image_compile_backends"] if opt["compile"] else []:
            row = rows.setdefault(b, {"backend": b})
            if ctx.time_left() < max(20.0, 1.5 * last):  # a compile it probably cannot finish: not started
                row["compiled"] = {"skipped": "stage budget spent"}
                continue
            row["compiled"] = {"skipped": "cut by the stage's budget while compiling"}
            ctx.save()
            try:
                t = time.perf_counter()
                stats0 = compile_totals(compile_stats(model))
                timed_generation(model, PROMPT, _backend(b, opt["image_presets"]), limit, seed=opt["seed"],
                                 compile=True)  # compiles and records
                first_s = time.perf_counter() - t
                compile_s = compile_totals(compile_stats(model))["compile_s"] - stats0["compile_s"]
                _, rec = _run(ctx, model, _backend(b, opt["image_presets"]), limit, ref, compile=True)
                rec.update(first_run_s=round(first_s, 2), compile_s=round(compile_s, 2))
                last = first_s
            except Exception as e:  # noqa: BLE001
                rec = {"error": error_text(e)}
            row["compiled"] = rec
            ratios_to_ar(rows, opt["ratio_base"])
            ctx.save()
    finally:
        capture_mod.GRAPH_BUFFERS_ON_CPU = before


def stage_images(ctx) -> None:
    """Each family of `image_families` in turn (the model freed before the next)."""
    opt = ctx.options
    families = ctx.result.setdefault("families", {})
    ctx.result.update(dtype="bfloat16", device=opt["device"], ratio_base=opt["ratio_base"],
                      released={n: {"checkpoint": RELEASED[n].spec.checkpoint, "assumed": RELEASED[n].assumed}
                                for n in opt["image_families"]})
    with tempfile.TemporaryDirectory(prefix="specar-gpu-check-images-") as workdir:
        for name in opt["image_families"]:
            fam = families.setdefault(name, {})
            if ctx.time_left() < 20:
                fam["skipped"] = "stage budget spent"
                continue
            try:
                _family(ctx, name, fam, workdir)
            except Exception as e:  # noqa: BLE001 -- the next family still runs
                fam["error"] = error_text(e)
            finally:
                if torch.device(opt["device"]).type == "cuda":
                    torch.cuda.empty_cache()
            ctx.save()


__all__ = ["PROMPT", "stage_images"]
