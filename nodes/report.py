"""What the sampler node shows after a run: the one-line summary and its notes, the statistics (JSON, which the
web extension shows on the node: the summary, the rest folded) and the acceptance heatmap."""
from __future__ import annotations

import json
from typing import Optional

import torch

from ..samplers import backends as _backends
from ..samplers.stats import busy_machine_note
from .spec import MOOT_WHEN_SAME_IMAGE


def heatmap(accepted_at_step: list, size: Optional[tuple] = None) -> torch.Tensor:
    """[H, W, 3] float image: each token coloured by how many tokens its step committed
    (dark purple: one, yellow: the longest step), so step boundaries show as colour changes."""
    steps = torch.as_tensor(accepted_at_step, dtype=torch.long)
    counts = torch.bincount(steps.flatten())
    length = counts[steps].float()  # tokens committed by the step that committed each token
    t = (length - 1) / max(float(length.max()) - 1, 1.0)
    stops = torch.tensor([[0.27, 0.00, 0.33], [0.23, 0.32, 0.55], [0.13, 0.57, 0.55], [0.37, 0.79, 0.38],
                          [0.99, 0.91, 0.14]])  # viridis-like
    x = t * (len(stops) - 1)
    i = x.floor().long().clamp(max=len(stops) - 2)
    frac = (x - i)[..., None]
    img = stops[i] * (1 - frac) + stops[i + 1] * frac
    if size is not None:
        img = torch.nn.functional.interpolate(img.permute(2, 0, 1)[None], size=size, mode="nearest")[0].permute(1, 2, 0)
    return img.clamp(0, 1).contiguous()


def token_totals(stats) -> tuple:
    """(image tokens, forward passes) summed over the images of a batch, each image's forwards counted
    with the prefill (which samples its first token): their ratio is the batch's step compression
    (AR: exactly 1), not a mean of per-image ratios."""
    tokens = stats.image_tokens * stats.batch
    forwards = sum(int(s) + 1 for s in stats.steps) if stats.steps else stats.nfe + 1
    return tokens, forwards


MIN_SAMPLES = 3  # compare_with_ar runs of the same settings before a verdict from their range
CLEAR_RATIO = 1.5  # one timing each: a verdict only beyond this factor (one CPU timing varies by 10-30%)


def compile_note(stats) -> str:
    """What compiling cost this run (not the process), or that it reused graphs compiled earlier."""
    c = stats.compile
    if not c:
        return ""
    if c.get("eager_fallback"):
        return "compile failed, ran eager"
    if c.get("compiles"):
        return (f"compiled {c['compiles']} graphs in {c['compile_s']:.1f} s (counted in this latency; later runs reuse "
                f"them)")
    return f"compiled step: reused {c.get('graphs_reused', 0)} graphs, no compile this run"


def verdict(ratio: float, ratios: Optional[list]) -> str:
    """Faster / slower only from enough samples: the range of this setting's compare_with_ar ratios once
    there are MIN_SAMPLES of them, else one timing each, decided only beyond CLEAR_RATIO."""
    runs = list(ratios or [ratio])
    if len(runs) >= MIN_SAMPLES:
        lo, hi = min(runs), max(runs)
        spread = f"{lo:.2f}-{hi:.2f}x over the last {len(runs)} runs with these settings"
        if lo > 1:
            return f"faster: {spread}"
        if hi < 1:
            return f"slower: {spread}; the extra drafting costs more than it saves on this device"
        return f"no clear difference: {spread}"
    if ratio >= CLEAR_RATIO:
        return "faster"
    if ratio <= 1 / CLEAR_RATIO:
        return "slower: the extra drafting costs more than it saves on this device"
    return (f"one timing each, within their noise: no verdict before {MIN_SAMPLES} runs with these settings "
            f"({len(runs)} so far)")


def short_verdict(ratio: float, ratios: Optional[list], lossy: bool, one_time: bool) -> str:
    """The verdict on a ratio in a few words, for the summary line (the notes say it in full)."""
    if lossy:
        return "not comparable: lossy"
    if one_time:
        return "no verdict: one-time costs in this run"
    full = verdict(ratio, ratios)
    if full.startswith("one timing each"):
        return "within timing noise: no verdict yet"
    head, _, rest = full.partition(": ")  # a verdict from several runs: with their range, not beside one ratio
    return f"{head}: {rest.split(' with these settings')[0]}" if " over the last " in rest else head


def moot_note(stats) -> str:
    """With same_image_as_ar on, the coupling parameters had no effect: said for a backend they define (SCD, then
    SJD's sampler), and for any other where one was set off its default."""
    if not stats.reproducible:
        return ""
    schema = _backends.SCHEMAS[stats.backend]
    declared = {p.name: p.default for p in schema.params if p.name in MOOT_WHEN_SAME_IMAGE}
    defines = len(declared) == len(MOOT_WHEN_SAME_IMAGE)
    moot = [k for k, d in declared.items() if defines or (stats.params or {}).get(k, d) != d]
    if not moot:
        return ""
    return (f"{' and '.join(moot)} had no effect: with same_image_as_ar on, a re-draft is AR's own sample"
            + (f", so {schema.label} samples as SJD does" if defines else ""))


def summary(stats, ar_stats=None, ratios: Optional[list] = None, first_run: bool = False,
            quantization: Optional[str] = None, undecoded: Optional[str] = None) -> tuple:
    """(one line, notes) for the node, as docs/NODES.md, "Nodes" (Afterwards) describes them. `ar_stats`: AR's run in
    the same execution, never one from another time or load; `ratios`: this setting's compare_with_ar ratios so far,
    this run's last; `quantization`: "int8", "int4" (None / "none": as stored); `undecoded`: why no decoder ran."""
    label = _backends.SCHEMAS[stats.backend].label
    if quantization not in (None, "none"):
        label += f" ({quantization} model)"
    if stats.lossy:
        label += " LOSSY (relaxed acceptance: not AR's distribution)"
    tokens, forwards = token_totals(stats)
    images = f"{stats.batch} images, " if stats.batch > 1 else ""
    summed = " summed over the images" if stats.batch > 1 else ""
    notes = []
    report = stats.backend_report or {}  # auto ran mostly plain AR, or no node budget beats AR: say so and why
    fallback = report.get("fell_back_to_ar") or (report.get("tuned") or {}).get("no_speedup")
    one_time = first_run or bool(stats.compile and stats.compile.get("compiles"))
    if stats.backend == "ar":
        line = f"{label}: {images}{tokens} tokens in {forwards} forward passes{summed}, {stats.latency_s:.2f} s"
    else:
        line = (f"{label}: {images}{tokens} tokens in {forwards} forward passes{summed} ({tokens / forwards:.1f}x "
                f"fewer than AR), {stats.latency_s:.2f} s")
        if ar_stats is None:
            notes.append("wall-clock speed-up: turn on compare_with_ar to measure AR in the same run")
        else:
            ratio = ar_stats.latency_s / max(stats.latency_s, 1e-9)
            compiled = bool(stats.compile) and not stats.compile.get("eager_fallback")
            ar_name = "eager (uncompiled) AR" if compiled else "AR"
            line += (f", {ratio:.2f}x {ar_name}'s {ar_stats.latency_s:.2f} s measured in this run "
                     f"({short_verdict(ratio, ratios, stats.lossy, one_time)})")
            if stats.lossy:
                notes.append("speed-up not comparable: a lossy run samples another distribution")
            elif one_time:
                notes.append("speed-up: no verdict: this run's one-time costs count against it; run again")
            else:
                notes.append("speed-up: " + verdict(ratio, ratios))
        if not stats.lossy:
            line += "; same image as AR" if stats.reproducible else "; its own draws from AR's distribution"
            if stats.reproducible and stats.same_image_guarantee == "not_guaranteed":  # batch_invariant.SameImage
                notes.append(f"same image as AR not guaranteed here ({stats.same_image_reason}): the distribution "
                             f"is AR's, the very image may differ")
    if undecoded:
        line += "; no image decoder ran: the image shows the codes' preview colours"
        notes.insert(0, undecoded)
    notes += [fallback or "", compile_note(stats), moot_note(stats)]
    busy = busy_machine_note()
    if busy:
        notes.append(busy[2:] + "; for steady timings close other work, or compare speed-ups measured in the same "
                     "run (compare_with_ar)")
    if first_run:
        notes.append("the model's first run since loading: one-time start-up costs are in this latency")
    return line, [n for n in notes if n]


def report(stats, ar_stats, settings, values: dict, model, size: tuple, preview_label: Optional[str],
           ratios: Optional[list] = None, first_run: bool = False, undecoded: Optional[str] = None) -> tuple:
    """(summary line and notes, statistics JSON) of a run: `GenerationStats` plus the summary and notes, the batch's
    totals, AR's latency measured in the same execution (`ar_stats`, or None), the readable backend name, the model,
    the sampling values used, the image's own size (H, W) and what the live preview showed (`preview_label`)."""
    quantization = getattr(model, "quantization", "none")
    line, notes = summary(stats, ar_stats, ratios, first_run, quantization, undecoded)
    out = stats.to_dict()
    out["summary"], out["notes"] = line, notes
    out["tokens_total"], out["forwards_total"] = token_totals(stats)
    if ar_stats is not None:
        out["ar_latency_s"] = ar_stats.latency_s
        out["speedup_vs_ar"] = ar_stats.latency_s / max(stats.latency_s, 1e-9)
        if ratios:
            out["speedup_vs_ar_runs"] = list(ratios)  # this setting's compare_with_ar ratios so far, this run's last
    out["first_run"] = first_run
    out["backend_label"] = _backends.SCHEMAS[settings.backend].label
    out["model"] = getattr(model, "name", type(model).__name__)
    out["quantization"] = quantization
    out["image_size"] = f"{size[1]}x{size[0]}"
    if preview_label is not None:
        out["preview_label"] = preview_label
    used = stats.sampling  # resolved once, by generate
    out["sampling"] = {"cfg_scale": used["cfg_scale"], "top_k": used["top_k"] or "off",
                       "temperature": used["temperature"], "top_p": used["top_p"],
                       "guidance": "model default" if settings.sampling.cfg_scale is None else "custom"}
    return "\n".join([line] + notes), json.dumps(out)
