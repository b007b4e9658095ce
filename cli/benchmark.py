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
from .threads import busy_note, choose_threads
from ..samplers.stats import acceptance_by_depth
from .regimes import REGIMES, regime

# the default run: every registered backend at its defaults, then the settings each method adds to the bench
# (`Method.bench_variants`: e.g. the SJD-PAC ablation of the paper, SJD -> +PD -> +PD+AC -> L=64); the
# drafter-based backends need their drafter beside the model (the demo model ships them)
DEFAULT_CONFIGS = [config for method in SCHEMAS.values() for config in method.bench_configs()]
DEFAULT_PROMPTS = [
    "a large red circle on a blue background",
    "a small yellow striped star on a noisy green background",
    "a white square on a black background",
    "a purple triangle on a noisy orange background",
]


# generate() options a configuration may set beside the backend's parameters (booleans)
RUN_KEYS = ("compile", "reproducible")


def in_both_modes(configs: List[dict]) -> List[dict]:
    """--both-modes: each configuration that does not set `reproducible` runs once in each mode
    (reproducible=false, then true: the same image as AR), so a backend's two modes sit side by side."""
    out = []
    for cfg in configs:
        out += [cfg] if "reproducible" in cfg else [{**cfg, "reproducible": False}, {**cfg, "reproducible": True}]
    return out


def same_tokens_as_ar(tokens: dict, label: str, ar_label: Optional[str]):
    """For a reproducible configuration: how many of its images are token-identical to the
    reproducible AR configuration's image of the same prompt and seed (None when there is none)."""
    if ar_label is None:
        return None
    mine, ar = tokens[label], tokens[ar_label]
    return sum(torch.equal(t, ar[key]) for key, t in mine.items() if key in ar)


def parse_config(text: str) -> dict:
    """'sjd_pac:window=64,tree_width=4' -> {'backend': 'sjd_pac', 'window': 64, 'tree_width': 4}."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in SCHEMAS:
        raise ValueError(f"unknown backend {name!r} in {text!r}; backends: {', '.join(SCHEMAS)}")
    declared = {p.name: p for p in SCHEMAS[name].params}
    kinds = {k: p.kind for k, p in declared.items()}
    params = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"expected key=value in {text!r}, got {item!r}")
        kind = bool if key in RUN_KEYS else kinds.get(key, str)  # an unknown key: make_backend names it
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key} must be true or false in {text!r}, got {value!r}")
            params[key] = value.lower() in ("true", "1")
        elif kind in (int, float):
            try:
                params[key] = kind(value)
            except ValueError:
                try:  # the parameter's own check refuses the text, naming its allowed range
                    declared[key].check(value)
                except ValueError as e:
                    raise ValueError(f"{e} (in {text!r})") from None
                raise  # unreachable: a string never passes a number's check
        else:
            params[key] = value
    make_backend(name, **{k: v for k, v in params.items() if k not in RUN_KEYS})  # validate now, not halfway through
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


def _load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # Windows: none
        return None


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


# tiny:...,key=value options: testing.tiny_model's keyword and its type
TINY_OPTIONS = {"hidden": ("hidden_size", int), "layers": ("num_layers", int), "heads": ("num_heads", int),
                "scale": ("logit_scale", float), "seed": ("seed", int)}


def _tiny_model(spec: str, device):
    """tiny:vocab,HxW[,row_end][,hidden=..,layers=..,heads=..,scale=..,seed=..]: a random-weight model
    (testing.tiny_model; the options default to its own, seed 0)."""
    from ..testing import tiny_model
    parts = [p.strip() for p in spec[5:].split(",")]
    try:
        vocab = int(parts[0])
        h, w = (int(x) for x in parts[1].split("x"))
        kwargs = {"seed": 0}
        for part in parts[2:]:
            if part == "row_end":
                kwargs["row_end"] = True
                continue
            key, eq, value = part.partition("=")
            if not eq or key not in TINY_OPTIONS:
                raise ValueError(part)
            name, kind = TINY_OPTIONS[key]
            kwargs[name] = kind(value)
    except (ValueError, IndexError):
        raise ValueError(f"bad tiny model spec {spec!r}; expected tiny:VOCAB,HxW[,row_end][,key=value...] with keys "
                         f"{', '.join(TINY_OPTIONS)}") from None
    return tiny_model(vocab, (h, w), device=device or "cpu", **kwargs)


def _model(spec: str, device, dtype, quantize="none"):
    if spec.startswith("tiny:"):  # random weights: for testing the command, and the `flat` regime
        if dtype is not None or quantize not in (None, "none"):
            raise ValueError("--dtype and --quantize apply to a model loaded from files (demo, a model folder); a "
                             "tiny: model is float32 and unquantized")
        return _tiny_model(spec, device)
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
    warmup_s, warmup_compile = {}, {}
    if warmup:  # also where a compiled configuration compiles and auto calibrates: timed apart
        for cfg, _ in variants[:len(configs)]:
            t = time.perf_counter()
            res = generate(model, prompts[0], seed=seeds[0], **sampling, **cfg)
            warmup_s[_label(cfg)] = time.perf_counter() - t
            warmup_compile[_label(cfg)] = res.stats.compile
    total = repeats * len(prompts) * len(seeds) * len(variants)
    done, t_start = 0, time.perf_counter()
    runs = {label(c, p): [] for c, p in variants}
    tokens = {_label(c): {} for c in configs}  # label -> {(prompt, seed, repeat): tokens} (runs without preview)
    shown = {label(c, p): 0 for c, p in variants}
    spent = {label(c, p): 0.0 for c, p in variants}  # seconds inside the preview (decode + JPEG) per variant
    for rep in range(repeats):
        for prompt in prompts:
            for seed in seeds:
                for cfg, with_preview in variants:
                    pv = _jpeg_preview(model) if with_preview else None
                    res = generate(model, prompt, seed=seed, preview=pv, **sampling, **cfg)
                    runs[label(cfg, with_preview)].append(res.stats)
                    if not with_preview:
                        tokens[_label(cfg)][(prompt, seed, rep)] = res.sequence
                    shown[label(cfg, with_preview)] += pv.shown if pv else 0
                    spent[label(cfg, with_preview)] += pv.spent_s if pv else 0.0
                    done += 1
                    if log:
                        eta = (time.perf_counter() - t_start) / done * (total - done)
                        log(f"[{done}/{total}, ETA {eta:.0f} s] {label(cfg, with_preview):45s} seed={seed} "
                            f"nfe={res.stats.nfe} {res.stats.latency_s:.3f}s")
    plain_ar = [_label(c) for c in configs if c["backend"] == "ar" and set(c) <= {"backend", "reproducible"}]
    ar_repro = next((a for a in plain_ar if runs[a][0].reproducible), None)
    ar = runs[plain_ar[0]] if plain_ar else None  # the speed-up baseline: the first plain AR configuration
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
            "reproducible": stats[0].reproducible,
            # reproducible configurations: images token-identical to reproducible AR's (same prompt and seed)
            "same_tokens_as_ar": same_tokens_as_ar(tokens, _label(cfg), ar_repro)
            if stats[0].reproducible and not with_preview else None,
            "acceptance_by_depth": acceptance_by_depth(hist),
            "accepted_length_histogram": {str(k): v for k, v in sorted(hist.items())},
            "prefill_s": statistics.mean(s.prefill_s for s in stats),
            "decode_s": decode,
            "latency_s": latency,
            "latency_median_s": statistics.median(s.latency_s for s in stats),
            "latency_stdev_s": statistics.stdev(s.latency_s for s in stats) if len(stats) > 1 else 0.0,
            "speedup_vs_ar": None if ar_latency is None else ar_latency / latency,
            "warmup_s": warmup_s.get(_label(cfg)),
            "compile": compile_row(warmup_compile.get(_label(cfg)), stats),
            "auto": [s.backend_report for s in stats] if cfg["backend"] == "auto" else None,
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
              "included); speedup: AR's latency / this latency, same run"]
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


def chosen_regime(name: Optional[str], model: Optional[str], sampling: dict):
    """The run's regime: --regime NAME (which fixes the model and the sampling: ValueError if either is
    also given), `demo` when neither a regime, a model nor a sampling setting is given, else None (a custom
    run, which the output says)."""
    if name is not None:
        given = (["--model"] if model is not None else []) + [f"--{k.replace('_', '-')}" for k in sampling]
        if given:
            raise ValueError(f"--regime {name} fixes the model and the sampling settings; drop {', '.join(given)} "
                             f"(or drop --regime for a custom run)")
        return regime(name)
    return regime("demo") if model is None and not sampling else None


def main(argv=None):
    ap = command_parser("bench", __doc__)
    ap.add_argument("--regime", choices=list(REGIMES), default=None,
                    help="fixes the model and its sampling settings (cli/regimes.py): demo (the demo model as it "
                    "samples), paper (the demo model calibrated to SJD's commit rate on Lumina-mGPT), flat (a "
                    "random-weight 8192-code target); without --regime and --model: demo")
    ap.add_argument("--model", default=None, help="built-in name, model folder, or tiny:V,HxW[,row_end][,key=value] "
                    "(keys: hidden, layers, heads, scale, seed); default: demo")
    ap.add_argument("--backends", nargs="+", default=DEFAULT_CONFIGS,
                    help="configurations like ar  sjd:window=32  sjd_pac:window=64,tree_width=4  ar:compile=true "
                    "(a parameter left out takes the backend's default; include `ar` for the speed-up column)")
    ap.add_argument("--windows", type=positive_int, nargs="+",
                    help="run each configuration without an explicit window once per window (e.g. 16 32 64)")
    ap.add_argument("--prompts", help="file with one prompt per line (default: 4 built-in prompts)")
    ap.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1],
                    help="seeds; every configuration runs every prompt with every seed")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="times the whole interleaved round runs (more samples per configuration)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the model's own choice)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="weights precision (default: the model's own)")
    ap.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                    help="weight-only quantization of the model folder's linear layers (docs/MODELS.md)")
    ap.add_argument("--threads", type=positive_int, help="torch CPU threads (default: the cores other processes leave "
                    "free, at least 1)")
    ap.add_argument("--cfg-scale", type=non_negative_float, default=None,
                    help="classifier-free guidance scale (default: the model's recommended one; 1: no guidance)")
    ap.add_argument("--top-k", type=non_negative_int, default=None,
                    help="keep the k most likely image tokens (default: the model's recommended one; 0: off, "
                    "every token)")
    ap.add_argument("--temperature", type=non_negative_float, default=None, help="sampling temperature (default 1)")
    ap.add_argument("--top-p", type=non_negative_float, default=None, help="nucleus sampling (default 1: off)")
    ap.add_argument("--json", help="write the rows (and the run's settings) to this file")
    ap.add_argument("--both-modes", action="store_true", help="run each configuration that does not set "
                    "reproducible twice: reproducible=false and reproducible=true (same image as AR), side by side")
    ap.add_argument("--preview", action="store_true", help="also run each configuration with the node's live "
                    "preview (interleaved) and report its overhead")
    ap.add_argument("--quiet", action="store_true", help="no progress line per generation on stderr")
    args = ap.parse_args(argv)
    sampling = {k: v for k, v in (("cfg_scale", args.cfg_scale), ("top_k", args.top_k),
                                  ("temperature", args.temperature), ("top_p", args.top_p)) if v is not None}
    try:
        the_regime = chosen_regime(args.regime, args.model, sampling)
        configs = with_windows([parse_config(c) for c in args.backends], args.windows)
        if args.both_modes:
            configs = in_both_modes(configs)
        if the_regime is not None:
            configs = the_regime.apply_run_options(configs)
    except ValueError as e:
        ap.error(str(e))
    if the_regime is not None:
        args.model, sampling = the_regime.model, dict(the_regime.sampling)
    args.model = args.model or "demo"
    if args.prompts and not os.path.isfile(args.prompts):
        ap.error(f"--prompts: no such file {args.prompts!r} (one prompt per line)")
    args.threads = choose_threads(args.threads)
    torch.set_num_threads(args.threads)  # after the checks: a refused command changes nothing
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [line.strip() for line in f if line.strip()]
    model = _model(args.model, args.device, args.dtype, args.quantize)
    t0 = time.time()
    rows = run(model, configs, prompts, args.seeds, args.repeats, sampling=sampling, preview=args.preview,
               log=None if args.quiet else (lambda s: print(s, file=sys.stderr)))
    meta = {"command": "python -m specar bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "model": args.model, "regime": the_regime.as_dict() if the_regime else None, "sampling": sampling,
            "prompts": prompts, "seeds": args.seeds, "repeats": args.repeats,
            "threads": args.threads, "device": str(model.device), "machine": platform.platform(),
            "processor": cpu_name(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1),
            "load_average": _load_average()}  # other processes' load: a busy machine's latencies are longer
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(format_table(rows))  # after the file: a closed stdout (| head) must not lose the run
    print("\n" + (the_regime.summary() if the_regime else f"regime: none (model {args.model}, sampling "
                                                              f"{sampling or 'the model' + chr(39) + 's own'})"))
    busy = busy_note(args.threads)
    if busy:
        print("\n" + busy)
    return rows


if __name__ == "__main__":
    main()
