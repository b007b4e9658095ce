"""`python -m specar bench`: every backend side by side on the same prompts and seeds, one run.

Configurations are interleaved (for each repeat, prompt and seed, every configuration runs once)
after one warm-up generation each, so slow drifts of a shared machine hit all of them alike, and
every ratio (speedup over AR) is measured within the run.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from typing import List, Optional

import torch

from ..model_loaders.registry import load_model
from .args import command_parser, non_negative_float, non_negative_int, positive_int
from ..samplers.api import generate
from ..samplers.backends import SCHEMAS, make_backend

# the default run: AR, the SJD-PAC ablation of the paper (SJD -> +PD -> +PD+AC -> L=64), SCD, Hawk and
# ADT-Tree (the drafter-based backends need their drafter beside the model: the demo model ships both)
DEFAULT_CONFIGS = [
    "ar",
    "sjd:window=32",
    "sjd_pac:window=32,continuation=false",  # + proactive drafting
    "sjd_pac:window=32",  # + adaptive continuation
    "sjd_pac:window=64",
    "scd:window=32,coupling=maximal",
    "scd:window=64,coupling=maximal",
    "scd:window=32,coupling=gumbel",
    "hawk",  # trained draft heads (the model's hawk_heads/)
    "adt_tree",  # EAGLE drafter with adaptive trees (the model's eagle_drafter/), lossless (relaxed off)
]
DEFAULT_PROMPTS = [
    "a large red circle on a blue background",
    "a small yellow striped star on a noisy green background",
    "a white square on a black background",
    "a purple triangle on a noisy orange background",
]


def parse_config(text: str) -> dict:
    """'sjd_pac:window=64,tree_width=4' -> {'backend': 'sjd_pac', 'window': 64, 'tree_width': 4}."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in SCHEMAS:
        raise ValueError(f"unknown backend {name!r} in {text!r}; backends: {', '.join(SCHEMAS)}")
    kinds = {p.name: p.kind for p in SCHEMAS[name].params}
    params = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"expected key=value in {text!r}, got {item!r}")
        kind = bool if key == "compile" else kinds.get(key, str)  # an unknown key: make_backend names it
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key} must be true or false in {text!r}, got {value!r}")
            params[key] = value.lower() in ("true", "1")
        elif kind in (int, float):
            try:
                params[key] = kind(value)
            except ValueError:
                raise ValueError(f"{key} must be {'an int' if kind is int else 'a number'} in "
                                 f"{text!r}, got {value!r}") from None
        else:
            params[key] = value
    make_backend(name, **{k: v for k, v in params.items() if k != "compile"})  # validate now, not halfway through
    return {"backend": name, **params}


def with_windows(configs: List[dict], windows: Optional[List[int]]) -> List[dict]:
    """--windows: each configuration that has a window parameter but did not set one runs once
    per window (in the given order); AR and configurations with an explicit window run as given."""
    if not windows:
        return configs
    out = []
    for cfg in configs:
        if any(p.name == "window" for p in SCHEMAS[cfg["backend"]].params) and "window" not in cfg:
            for w in windows:
                out.append(parse_config(_label({**cfg, "window": w})))  # validated like the rest
        else:
            out.append(cfg)
    return out


def cpu_name() -> str:
    """The CPU model (Linux: /proc/cpuinfo), else what `platform` knows: figures differ a lot
    between CPU models, so every benchmark file records it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _label(cfg: dict) -> str:
    rest = ",".join(f"{k}={v}" for k, v in cfg.items() if k != "backend")
    return cfg["backend"] + (f":{rest}" if rest else "")


def _model(spec: str, device, dtype, quantize="none"):
    if spec.startswith("tiny:"):  # tiny:vocab,HxW[,row_end] -- random weights, for testing the command
        from ..testing import tiny_model
        parts = spec[5:].split(",")
        h, w = (int(x) for x in parts[1].split("x"))
        return tiny_model(int(parts[0]), (h, w), seed=0, row_end="row_end" in parts[2:], device=device or "cpu")
    return load_model(spec, device=device, dtype=dtype, quantize=quantize)


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
    label = lambda c, p: _label(c) + (PREVIEW_SUFFIX if p else "")  # noqa: E731
    warmup_s = {}
    if warmup:  # also where a compiled configuration compiles and auto calibrates: timed apart
        for cfg, _ in variants[:len(configs)]:
            t = time.perf_counter()
            generate(model, prompts[0], seed=seeds[0], **sampling, **cfg)
            warmup_s[_label(cfg)] = time.perf_counter() - t
    total = repeats * len(prompts) * len(seeds) * len(variants)
    done, t_start = 0, time.perf_counter()
    runs = {label(c, p): [] for c, p in variants}
    shown = {label(c, p): 0 for c, p in variants}
    spent = {label(c, p): 0.0 for c, p in variants}  # seconds inside the preview (decode + JPEG) per variant
    for _ in range(repeats):
        for prompt in prompts:
            for seed in seeds:
                for cfg, with_preview in variants:
                    pv = _jpeg_preview(model) if with_preview else None
                    res = generate(model, prompt, seed=seed, preview=pv, **sampling, **cfg)
                    runs[label(cfg, with_preview)].append(res.stats)
                    shown[label(cfg, with_preview)] += pv.shown if pv else 0
                    spent[label(cfg, with_preview)] += pv.spent_s if pv else 0.0
                    done += 1
                    if log:
                        eta = (time.perf_counter() - t_start) / done * (total - done)
                        log(f"[{done}/{total}, ETA {eta:.0f} s] {label(cfg, with_preview):45s} seed={seed} "
                            f"nfe={res.stats.nfe} {res.stats.latency_s:.3f}s")
    ar = runs.get("ar")
    ar_latency = statistics.mean(s.latency_s for s in ar) if ar else None
    ar_nfe = statistics.mean(s.nfe + 1 for s in ar) if ar else None
    rows = []
    for cfg, with_preview in variants:
        stats = runs[label(cfg, with_preview)]
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
            "label": label(cfg, with_preview) + (" (LOSSY)" if any(s.lossy for s in stats) else ""),
            "previews": shown[label(cfg, with_preview)] / len(stats) if with_preview else None,
            # medians: one run slowed 10x by another job on a shared machine must not decide a 3% figure
            "preview_overhead": (statistics.median(s.latency_s for s in stats) /
                                 statistics.median(s.latency_s for s in runs[_label(cfg)]) - 1) if with_preview else None,
            # the preview's own time over the generation time of the same runs: a ratio within each run,
            # which another job slowing the machine down does not move (the median difference above it can)
            "preview_time_share": (spent[label(cfg, with_preview)] / sum(s.latency_s for s in stats))
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
            "accepted_length_histogram": {str(k): v for k, v in sorted(hist.items())},
            "prefill_s": statistics.mean(s.prefill_s for s in stats),
            "decode_s": decode,
            "latency_s": latency,
            "latency_median_s": statistics.median(s.latency_s for s in stats),
            "latency_stdev_s": statistics.stdev(s.latency_s for s in stats) if len(stats) > 1 else 0.0,
            "speedup_vs_ar": None if ar_latency is None else ar_latency / latency,
            "warmup_s": warmup_s.get(_label(cfg)),
            "compile": stats[-1].compile,  # the model's counters after this configuration's last run
            "auto": [s.backend_report for s in stats] if cfg["backend"] == "auto" else None,
            "overhead_share": (statistics.mean(overhead) / decode) if overhead and decode > 0 else None,
            "peak_memory_bytes": max(peak) if peak else None,
        })
    return rows


def format_table(rows: List[dict]) -> str:
    """The stdout report: one line per configuration, then each one's accepted-length histogram."""
    head = (f"{'configuration':44s} {'NFE':>7s} {'compr.':>7s} {'total':>7s} {'acc.len':>7s} {'prefill':>8s} "
            f"{'decode':>8s} {'latency':>8s} {'speedup':>8s} {'overhead':>8s} {'peak mem':>9s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        sp = "-" if r["speedup_vs_ar"] is None else f"{r['speedup_vs_ar']:.2f}x"
        ov = "-" if r["overhead_share"] is None else f"{100 * r['overhead_share']:.0f}%"
        mem = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**20:.0f} MiB"
        lines.append(f"{r['label']:44s} {r['nfe']:7.1f} {r['step_compression']:6.2f}x "
                     f"{r['step_compression_total']:6.2f}x {r['mean_accepted_length']:7.2f} "
                     f"{r['prefill_s']:7.3f}s {r['decode_s']:7.3f}s {r['latency_s']:7.3f}s {sp:>8s} {ov:>8s} {mem:>9s}")
    lines += ["", "compr.: step compression, mean of per-image ratios; total: all image tokens / all forwards (prefill "
              "included); speedup: AR's latency / this latency, same run"]
    compiled = [r for r in rows if r.get("compile")]
    if compiled:
        lines += ["", "compiled (torch.compile of the model forward): compile time (the warm-up run, not in latency), "
                  "graphs, recompiles, graph breaks (model totals after the configuration)"]
        for r in compiled:
            c = r["compile"]
            note = f", EAGER FALLBACK: {c['eager_fallback']}" if c["eager_fallback"] else ""
            lines.append(f"{r['label']:44s} compile {c['compile_s']:.1f} s (warm-up run {r['warmup_s']:.1f} s), "
                         f"{c['compiles']} graphs, {c['recompiles']} recompiles, {c['graph_breaks']} graph "
                         f"breaks{note}")
    autos = [r for r in rows if r.get("auto")]
    if autos:
        lines += ["", "auto: steps per window, summed over the configuration's runs"]
        for r in autos:
            used = {}
            for rep in r["auto"]:
                for w, n in rep["steps_per_window"].items():
                    used[w] = used.get(w, 0) + n
            steps = sorted(used.items(), key=lambda x: int(x[0]))
            lines.append(f"{r['label']:44s} " + " ".join(f"W{w}:{n}" for w, n in steps))
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
    return "\n".join(lines)


def main(argv=None):
    ap = command_parser("bench", __doc__)
    ap.add_argument("--model", default="demo", help="built-in name, model folder, or tiny:V,HxW[,row_end]")
    ap.add_argument("--backends", nargs="+", default=DEFAULT_CONFIGS,
                    help="configurations like ar  sjd:window=32  sjd_pac:window=64,tree_width=4")
    ap.add_argument("--windows", type=positive_int, nargs="+",
                    help="run each configuration without an explicit window once per window (e.g. 16 32 64)")
    ap.add_argument("--prompts", help="file with one prompt per line (default: 4 built-in prompts)")
    ap.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=positive_int, default=1)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16", "float16"])
    ap.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                    help="weight-only quantization of the model folder's linear layers (docs/MODELS.md)")
    ap.add_argument("--threads", type=positive_int, default=1,
                    help="torch CPU threads (1: steadier timings on a shared machine)")
    ap.add_argument("--cfg-scale", type=non_negative_float, default=None)
    ap.add_argument("--top-k", type=positive_int, default=None)
    ap.add_argument("--json", help="write the rows (and the run's settings) to this file")
    ap.add_argument("--preview", action="store_true", help="also run each configuration with the node's live "
                    "preview (interleaved) and report its overhead")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        configs = with_windows([parse_config(c) for c in args.backends], args.windows)
    except ValueError as e:
        ap.error(str(e))
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [line.strip() for line in f if line.strip()]
    model = _model(args.model, args.device, args.dtype, args.quantize)
    sampling = {k: v for k, v in (("cfg_scale", args.cfg_scale), ("top_k", args.top_k)) if v is not None}
    t0 = time.time()
    rows = run(model, configs, prompts, args.seeds, args.repeats, sampling=sampling, preview=args.preview,
               log=None if args.quiet else (lambda s: print(s, file=sys.stderr)))
    meta = {"command": "python -m specar bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "model": args.model, "prompts": prompts, "seeds": args.seeds, "repeats": args.repeats,
            "threads": args.threads, "device": str(model.device), "machine": platform.platform(),
            "processor": cpu_name(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(format_table(rows))  # after the file: a closed stdout (| head) must not lose the run
    return rows


if __name__ == "__main__":
    main()
