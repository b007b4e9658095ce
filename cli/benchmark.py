"""The bench's measurement (cli/bench.py is the command): its configurations (`backend[:key=value,...]`,
validated against the registry), the interleaved run of all of them, and its table."""
from __future__ import annotations

import statistics
import time
from typing import List, Optional

import torch

from ..samplers.api import generate
from ..samplers.backends import SCHEMAS, bench_configs, make_backend
from ..samplers.stats import acceptance_by_depth
from .schema import generate_args, parse_config

# the default run: every registered backend at its defaults, then the settings each method adds to the bench
# (`Method.bench_variants`); the drafter-based backends need their drafter beside the model (the demo model's are)
DEFAULT_CONFIGS = bench_configs()
def label(cfg: dict) -> str:
    """{'backend': 'sjd', 'window': 8} -> 'sjd:window=8' (what parse_config reads back)."""
    rest = ",".join(f"{k}={v}" for k, v in cfg.items() if k != "backend")
    return cfg["backend"] + (f":{rest}" if rest else "")


def with_windows(configs: List[dict], windows: Optional[List[int]]) -> List[dict]:
    """--windows: each configuration that has a window parameter but did not set one runs once
    per window (in the given order); AR and configurations with an explicit window run as given."""
    if not windows:
        return configs
    out = []
    for cfg in configs:
        if any(p.name == "window" for p in SCHEMAS[cfg["backend"]].params) and "window" not in cfg:
            out += [parse_config(label({**cfg, "window": w})) for w in windows]  # validated like the rest
        else:
            out.append(cfg)
    return out


def in_both_modes(configs: List[dict]) -> List[dict]:
    """--both-modes: each configuration that does not set `reproducible` runs once in each mode
    (reproducible=false, then true: the same image as AR), so a backend's two modes sit side by side."""
    out = []
    for cfg in configs:
        out += [cfg] if "reproducible" in cfg else [{**cfg, "reproducible": False}, {**cfg, "reproducible": True}]
    return out


def same_tokens_as_ar(tokens: dict, name: str, ar_label: Optional[str]):
    """For a reproducible configuration: how many of its images are token-identical to the
    reproducible AR configuration's image of the same prompt and seed (None when there is none)."""
    if ar_label is None:
        return None
    mine, ar = tokens[name], tokens[ar_label]
    return sum(torch.equal(t, ar[key]) for key, t in mine.items() if key in ar)


PREVIEW_SUFFIX = " +preview"


def _jpeg_preview(model):
    """The node's live preview without ComfyUI: the same throttle and decode, JPEG-encoded as
    ComfyUI's previewer does (into memory)."""
    import io

    from ..samplers.preview import PREVIEW_THROTTLE, PartialImage

    def emit(images, committed, total):
        images[0].save(io.BytesIO(), format="JPEG", quality=95)

    return PartialImage(model, emit, **PREVIEW_THROTTLE)


def run(model, configs: List[dict], prompts: List[str], seeds: List[int], repeats: int = 1, warmup: bool = True,
        sampling: Optional[dict] = None, log=None, preview: bool = False) -> List[dict]:
    """preview: every configuration also runs with the node's live preview (label + " +preview"),
    interleaved with the run without it, so that the preview's overhead is a ratio within the run."""
    sampling = sampling or {}
    variants = [(c, False) for c in configs] + ([(c, True) for c in configs] if preview else [])
    vlabel = lambda c, p: label(c) + (PREVIEW_SUFFIX if p else "")  # noqa: E731
    warmup_s, warmup_compile = {}, {}
    if warmup:  # also where a compiled configuration compiles and auto calibrates: timed apart
        for cfg, _ in variants[:len(configs)]:
            t = time.perf_counter()
            res = generate(model, prompts[0], seed=seeds[0], sampling=sampling, **generate_args(cfg))
            warmup_s[label(cfg)] = time.perf_counter() - t
            warmup_compile[label(cfg)] = res.stats.compile
    total = repeats * len(prompts) * len(seeds) * len(variants)
    done, t_start = 0, time.perf_counter()
    runs = {vlabel(c, p): [] for c, p in variants}
    tokens = {label(c): {} for c in configs}  # label -> {(prompt, seed, repeat): tokens} (runs without preview)
    shown = {vlabel(c, p): 0 for c, p in variants}
    spent = {vlabel(c, p): 0.0 for c, p in variants}  # seconds inside the preview (decode + JPEG) per variant
    for rep in range(repeats):
        for prompt in prompts:
            for seed in seeds:
                for cfg, with_preview in variants:
                    pv = _jpeg_preview(model) if with_preview else None
                    res = generate(model, prompt, seed=seed, sampling=sampling, **generate_args(cfg, preview=pv))
                    runs[vlabel(cfg, with_preview)].append(res.stats)
                    if not with_preview:
                        tokens[label(cfg)][(prompt, seed, rep)] = res.sequence
                    shown[vlabel(cfg, with_preview)] += pv.shown if pv else 0
                    spent[vlabel(cfg, with_preview)] += pv.spent_s if pv else 0.0
                    done += 1
                    if log:
                        eta = (time.perf_counter() - t_start) / done * (total - done)
                        log(f"[{done}/{total}, ETA {eta:.0f} s] {vlabel(cfg, with_preview):45s} seed={seed} "
                            f"nfe={res.stats.nfe} {res.stats.latency_s:.3f}s")
    plain_ar = [c for c in configs if c["backend"] == "ar" and set(c) <= {"backend", "reproducible", "compile"}]
    ar_repro = next((label(a) for a in plain_ar if not a.get("compile") and runs[label(a)][0].reproducible), None)
    # the speed-up baseline: the first plain AR configuration compiled as the row is (else the first one)
    baseline = {bool(c.get("compile")): runs[label(c)] for c in reversed(plain_ar)}
    rows = []
    for cfg, with_preview in variants:
        stats = runs[vlabel(cfg, with_preview)]
        ar = baseline.get(bool(cfg.get("compile")), next(iter(baseline.values()), None))
        ar_latency = statistics.mean(s.latency_s for s in ar) if ar else None
        ar_nfe = statistics.mean(s.nfe + 1 for s in ar) if ar else None
        hist = {}
        for s in stats:
            for k, v in s.accepted_length_histogram.items():
                hist[k] = hist.get(k, 0) + v
        latency = statistics.mean(s.latency_s for s in stats)
        decode = statistics.mean(s.decode_s for s in stats)
        overhead = [s.overhead_s for s in stats if s.overhead_s is not None]
        peak = [s.peak_memory_bytes for s in stats if s.peak_memory_bytes is not None]
        rows.append({
            "backend": cfg["backend"],
            "params": stats[0].params,
            "label": vlabel(cfg, with_preview) + (" (LOSSY)" if any(s.lossy for s in stats) else ""),
            "previews": shown[vlabel(cfg, with_preview)] / len(stats) if with_preview else None,
            # medians: one run slowed 10x by another job on a shared machine must not decide a 3% figure
            "preview_overhead": (statistics.median(s.latency_s for s in stats) /
                                 statistics.median(s.latency_s for s in runs[label(cfg)]) - 1) if with_preview else None,
            # the preview's own time over the generation time of the same runs: a ratio within each run,
            # which another job slowing the machine down does not move (the median difference above it can)
            "preview_time_share": (spent[vlabel(cfg, with_preview)] / sum(s.latency_s for s in stats))
            if with_preview else None,
            "lossy": any(s.lossy for s in stats),  # relaxed acceptance: not the AR distribution
            "samples": len(stats),
            "nfe": statistics.mean(s.nfe for s in stats),
            "step_compression": statistics.mean(s.step_compression for s in stats),  # mean of per-image ratios
            # the aggregate: all image tokens of the run / all forwards that produced them (prefill included)
            "step_compression_total": sum(s.image_tokens * s.batch for s in stats) /
            sum(n + 1 for s in stats for n in s.steps),
            "forward_ratio_vs_ar": None if ar_nfe is None else ar_nfe / statistics.mean(s.nfe + 1 for s in stats),
            "mean_accepted_length": statistics.mean(s.mean_accepted_length for s in stats),
            "reproducible": stats[0].reproducible,
            # reproducible configurations: images token-identical to reproducible AR's (same prompt and seed)
            "same_tokens_as_ar": same_tokens_as_ar(tokens, label(cfg), ar_repro)
            if stats[0].reproducible and not with_preview else None,
            "acceptance_by_depth": acceptance_by_depth(hist),
            "accepted_length_histogram": {str(k): v for k, v in sorted(hist.items())},
            "prefill_s": statistics.mean(s.prefill_s for s in stats),
            "decode_s": decode,
            "latency_s": latency,
            "latency_median_s": statistics.median(s.latency_s for s in stats),
            "latency_stdev_s": statistics.stdev(s.latency_s for s in stats) if len(stats) > 1 else 0.0,
            "speedup_vs_ar": None if ar_latency is None else ar_latency / latency,
            "warmup_s": warmup_s.get(label(cfg)),
            "compile": compile_row(warmup_compile.get(label(cfg)), stats),
            # an adaptive backend's reports of what it chose (GenerationStats.backend_report), under its name
            **({cfg["backend"]: [s.backend_report for s in stats]} if stats[0].backend_report is not None else {}),
            "overhead_share": (statistics.mean(overhead) / decode) if overhead and decode > 0 else None,
            "peak_memory_bytes": max(peak) if peak else None,
        })
    return rows


def compile_row(warmup: Optional[dict], stats: list) -> Optional[dict]:
    """A compiled configuration's own compile: what its warm-up run compiled (graphs, seconds) and what its
    timed runs compiled (0 when the warm-up compiled every shape they use), never the model's totals,
    which include the other configurations' graphs (each run's `model_total` has those)."""
    runs = [s.compile for s in stats if s.compile]
    if not runs:
        return None
    counters = ("compiles", "recompiles", "graph_breaks", "compile_s")
    out = {k: (warmup or {}).get(k, 0) + sum(r[k] for r in runs) for k in counters}
    out["warmup_compiles"] = (warmup or {}).get("compiles", 0)
    out["warmup_compile_s"] = (warmup or {}).get("compile_s", 0.0)
    out["timed_compiles"] = sum(r["compiles"] for r in runs)
    out["eager_fallback"] = runs[-1]["eager_fallback"]
    # the decode time spent outside the compiled step's graphs (host reads, plans, the first step of a plan)
    decode = sum(s.decode_s for s in stats if s.compile)
    inside = sum(r.get("step_graph_s", 0.0) for r in runs)
    out["outside_graph_share"] = max(decode - inside, 0.0) / decode if decode > 0 else None
    return out


def format_table(rows: List[dict]) -> str:
    """The stdout report: one line per configuration, then each one's accepted-length histogram."""
    head = (f"{'configuration':44s} {'NFE':>7s} {'compr.':>7s} {'total':>7s} {'acc.len':>7s} {'prefill':>8s} "
            f"{'decode':>8s} {'latency':>8s} {'speedup':>8s} {'overhead':>8s} {'peak mem':>9s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        sp = "-" if r["speedup_vs_ar"] is None else f"{r['speedup_vs_ar']:.2f}x"  # no `ar` row: no reference
        ov = "-" if r["overhead_share"] is None else f"{100 * r['overhead_share']:.0f}%"
        mem = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**20:.0f} MiB"
        lines.append(f"{r['label']:44s} {r['nfe']:7.1f} {r['step_compression']:6.2f}x "
                     f"{r['step_compression_total']:6.2f}x {r['mean_accepted_length']:7.2f} "
                     f"{r['prefill_s']:7.3f}s {r['decode_s']:7.3f}s {r['latency_s']:7.3f}s {sp:>8s} {ov:>8s} {mem:>9s}")
    lines += ["", "compr.: step compression, mean of per-image ratios; total: all image tokens / all forwards (prefill "
              "included); speedup: AR's latency / this latency, same run (a compiled row: compiled AR's when it ran)"]
    if rows and all(r["speedup_vs_ar"] is None for r in rows):
        lines.append("speedup '-': no plain `ar` row in this run to compare with; add `ar` to --backends (eager AR: "
                     "`ar`, compiled AR: `ar:compile=true`)")
    compiled = [r for r in rows if r.get("compile")]
    if compiled:
        lines += ["", "compiled (torch.compile of the whole decode step), this configuration's own compile: graphs "
                  "and seconds in its warm-up run (not in latency) and in its timed runs (0: the warm-up compiled every "
                  "plan), recompiles, graph breaks, the share of decode time outside the compiled graphs"]
        for r in compiled:
            c = r["compile"]
            note = f", EAGER FALLBACK: {c['eager_fallback']}" if c["eager_fallback"] else ""
            warm = "-" if r["warmup_s"] is None else f"{r['warmup_s']:.1f} s"
            outside = c.get("outside_graph_share")
            share = "-" if outside is None else f"{100 * outside:.1f}%"
            lines.append(f"{r['label']:44s} warm-up compiled {c['warmup_compiles']} graphs in {c['warmup_compile_s']:.1f} s "
                         f"(warm-up run {warm}), timed runs compiled {c['timed_compiles']}, {c['recompiles']} "
                         f"recompiles, {c['graph_breaks']} graph breaks, {share} of decode outside the graphs{note}")
    adaptive = [r for r in rows if any("steps_per_window" in rep for rep in r.get(r["backend"]) or ())]
    if adaptive:
        lines += ["", "adaptive backends: steps per window, summed over the configuration's runs"]
        for r in adaptive:
            used = {}
            for rep in r[r["backend"]]:
                for w, n in rep["steps_per_window"].items():
                    used[w] = used.get(w, 0) + n
            steps = sorted(used.items(), key=lambda x: int(x[0]))
            lines.append(f"{r['label']:44s} " + " ".join(f"W{w}:{n}" for w, n in steps))
    tuned = [r for r in rows if any("tuned" in rep for rep in r.get(r["backend"]) or ())]
    if tuned:
        lines += ["", "node budget chosen from this machine's measured costs (node_budget=0): the choice (its runs), "
                  "drafting / target forward cost at it, predicted speed-up over AR, the acceptance it assumed"]
        for r in tuned:
            chosen = [rep["tuned"] for rep in r[r["backend"]]]
            best = statistics.mode(c["node_budget"] for c in chosen)
            c = next(c for c in chosen if c["node_budget"] == best)
            lines.append(f"{r['label']:44s} node_budget {best} ({sum(x['node_budget'] == best for x in chosen)}/"
                         f"{len(chosen)}), draft/target {c['draft_target_ratio']:.2f}, predicted "
                         f"{c['predicted_speedup']:.2f}x, accept {c['accept']:.2f}"
                         + (f"; {c['no_speedup']}" if c["no_speedup"] else ""))
    with_preview = [r for r in rows if r.get("preview_overhead") is not None]
    if with_preview:
        lines += ["", "live preview (the node's default: decode + JPEG, throttled): time inside the preview / "
                  "generation time; median latency with / without - 1"]
        for r in with_preview:
            lines.append(f"{r['label']:44s} preview time {100 * r['preview_time_share']:.1f}%, latency "
                         f"{100 * r['preview_overhead']:+.1f}%, {r['previews']:.1f} previews per image")
    lines += ["", "tokens committed per step: how many steps (summed over all runs of a configuration)"]
    for r in rows:
        hist = " ".join(f"{k}:{v}" for k, v in r["accepted_length_histogram"].items())
        lines.append(f"{r['label']:44s} {hist}")
    repro = [r for r in rows if r.get("same_tokens_as_ar") is not None]
    if repro:
        lines += ["", "reproducible (same image as AR): images token-identical to reproducible AR's, same prompt and "
                  "seed"]
        for r in repro:
            lines.append(f"{r['label']:44s} {r['same_tokens_as_ar']}/{r['samples']}")
    lines += ["", "acceptance by depth d: steps that accepted a d-th draft / steps that accepted d - 1 (1..6)"]
    for r in rows:
        lines.append(f"{r['label']:44s} " + " ".join(f"{v:.2f}" for v in list(r["acceptance_by_depth"].values())[:6]))
    return "\n".join(lines)
