"""What a generation reports: steps, forwards, tokens per forward, latency (the sampler node's stats output)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Optional

import torch


@dataclass
class GenerationStats:
    backend: str
    params: dict
    batch: int
    image_tokens: int  # per image
    forced_tokens: int  # per image (row ends): never sampled, never a forward of their own
    nfe: int  # decode forward passes of the batch (prefill excluded)
    steps: list  # decode forwards each image needed
    step_compression: float  # image tokens / (decode forwards + the prefill), mean over images; AR: 1.0
    mean_accepted_length: float  # sequence tokens committed per forward, mean over the batch's steps
    accepted_length_histogram: dict  # {tokens committed in a step: how many steps}
    prefill_s: float
    decode_s: float
    latency_s: float  # prefill + decode, device-synchronised
    forward_s: Optional[float] = None  # time inside model forwards (CPU only, or profile=True)
    overhead_s: Optional[float] = None  # decode time outside model forwards: drafting + verification
    peak_memory_bytes: Optional[int] = None  # CUDA only
    accepted_at_step: list = field(default_factory=list)  # per image: [H][W] decode step of each token
    lossy: bool = False  # True only for an explicitly lossy option (relaxed acceptance)
    reproducible: bool = False  # "same image as AR": verified by agreement with AR's own draws
    # reproducible: batch_invariant.SameImage's value (batch_invariant / shape_pinned / tested / not_guaranteed; its
    # meaning beside it), and why in words; None outside the same-image mode
    same_image_guarantee: Optional[str] = None
    same_image_reason: Optional[str] = None
    backend_report: Optional[dict] = None  # what an adaptive backend chose and why (auto)
    compile: Optional[dict] = None  # compiled step, this generation: compiles, compile_s, graphs reused; model_total
    # the sampling settings used, resolved once (the model's recommended values filled in by generate):
    # cfg_scale, temperature, top_k (0: off), top_p
    sampling: Optional[dict] = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accepted_length_histogram"] = {str(k): v for k, v in sorted(self.accepted_length_histogram.items())}
        # per-position agreement (the reproducible mode) / acceptance: {depth: accepted / reached}
        d["acceptance_by_depth"] = acceptance_by_depth(self.accepted_length_histogram)
        return d


def generation_stats(ctx, log, at_step: torch.Tensor, seconds: tuple,
                     compile_report: Optional[dict]) -> GenerationStats:
    """The report of one generation (`ctx`: its run_state.RunContext) from its per-step log (`log`:
    decode_step.StepLog), `at_step` ([B, positions]: the decode step that settled each position), its (prefill, decode)
    seconds and its compile report."""
    model, B, (prefill_s, decode_s), same_image = ctx.model, ctx.batch, seconds, ctx.same_image
    geo, dev = model.geometry, model.device
    if log.committed:
        committed = torch.stack(log.committed, 1).cpu()  # [B, steps]
        active = torch.stack(log.active, 1).cpu()
    else:
        committed = torch.zeros(B, 0, dtype=torch.long)
        active = torch.zeros(B, 0, dtype=torch.bool)
    steps = active.sum(1).tolist()
    lengths = committed[active]
    hist = {int(k): int(c) for k, c in zip(*torch.unique(lengths, return_counts=True))}
    img_pos = geo.image_positions().to(at_step.device)
    maps = at_step[:, img_pos].view(B, geo.height, geo.width).cpu().tolist()
    n_img = geo.num_image_tokens
    forward_s = log.forward_s if log.timed else None
    return GenerationStats(
        backend=ctx.backend, params=dict(ctx.backend_params), batch=B,
        image_tokens=n_img, forced_tokens=geo.seq_len - n_img, nfe=len(log.committed), steps=steps,
        # the prefill forward yields the first token, so AR compresses exactly 1.0
        step_compression=sum(n_img / (s + 1) for s in steps) / B,
        mean_accepted_length=float(lengths.float().mean()) if lengths.numel() else 0.0,
        accepted_length_histogram=hist, prefill_s=prefill_s, decode_s=decode_s,
        latency_s=prefill_s + decode_s, forward_s=forward_s,
        overhead_s=None if forward_s is None else max(decode_s - forward_s, 0.0),
        peak_memory_bytes=torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
        accepted_at_step=maps, lossy=not log.drafter.lossless, backend_report=None if log.adaptive is None else log.adaptive.report(),
        reproducible=ctx.reproducible, compile=compile_report, sampling=asdict(ctx.sampling), same_image_reason=same_image.reason,
        same_image_guarantee=None if same_image.guarantee is None else same_image.guarantee.value)


def chained_stats(first: GenerationStats, rows: list) -> GenerationStats:
    """The report of a two-grid generation: `first` (the preceding stage, the whole batch) then `rows[b]` (image b's
    grid after it, batch 1). Counts and times are summed; each second-grid prefill is a forward that yields a token, as
    a decode step of one sequence over both grids would (AR: step compression 1.0); the per-token step maps are the
    second grid's (the image's; the first grid's are in its own result); the settings and the backend report, the first
    image's second grid's."""
    hist = dict(first.accepted_length_histogram)
    for r in rows:
        for k, v in r.accepted_length_histogram.items():
            hist[k] = hist.get(k, 0) + v
    n_img = first.image_tokens + rows[0].image_tokens
    steps = [s + 1 + r.steps[0] for s, r in zip(first.steps, rows)]
    parts = [first, *rows]

    def total(name):
        values = [getattr(p, name) for p in parts]
        return None if None in values else sum(values)

    return replace(
        rows[0], batch=first.batch, image_tokens=n_img, forced_tokens=first.forced_tokens + rows[0].forced_tokens,
        nfe=first.nfe + sum(r.nfe + 1 for r in rows), steps=steps,
        step_compression=sum(n_img / (s + 1) for s in steps) / len(steps),
        mean_accepted_length=sum(k * v for k, v in hist.items()) / max(sum(hist.values()), 1),
        accepted_length_histogram=hist, prefill_s=total("prefill_s"), decode_s=total("decode_s"),
        latency_s=total("latency_s"), forward_s=total("forward_s"), overhead_s=total("overhead_s"),
        peak_memory_bytes=None if first.peak_memory_bytes is None else max(p.peak_memory_bytes for p in parts),
        accepted_at_step=[r.accepted_at_step[0] for r in rows],
        compile=None if first.compile is None else {  # counts summed; the eager fallback and totals: the last run's
            k: sum(p.compile[k] for p in parts) if isinstance(v, (int, float)) else rows[-1].compile[k]
            for k, v in first.compile.items()})


def busy_machine_note() -> str:
    """"; machine busy (...)" when other processes keep every CPU core busy (the 1-minute load average at least the core
    count: os.getloadavg, Unix), else "": timings are then slower than on an idle machine and vary between runs, which a
    reader of one latency must know."""
    import os
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows: no load average
        return ""
    cores = os.cpu_count() or 1
    if load < cores:
        return ""
    return (f"; machine busy (load average {load:.1f} on {cores} cores): latencies are longer than on an idle "
            f"machine and vary between runs")


def acceptance_by_depth(histogram: dict, depths: int = 8) -> dict:
    """{d: share of the steps that reached draft depth d (accepted d - 1 drafts) which also accepted their d-th draft}
    from a histogram {tokens committed in a step: steps} (a step commits its accepted drafts plus one token).
    Per-position agreement in the reproducible mode; a step whose tree had no d-th draft counts as not accepting it."""
    counts = {int(k): v for k, v in histogram.items()}
    out = {}
    for d in range(1, depths + 1):
        reached = sum(v for k, v in counts.items() if k >= d)
        out[str(d)] = round(sum(v for k, v in counts.items() if k >= d + 1) / reached, 4) if reached else 0.0
    return out
