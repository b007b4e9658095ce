"""`python -m specar bench`: every backend side by side on the same prompts and seeds, one run.

Configurations are interleaved (for each repeat, prompt and seed, every configuration runs once)
after one warm-up generation each, so slow drifts of a shared machine hit all of them alike, and
every ratio (speedup over AR) is measured within the run.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

from . import schema
from ..samplers.backends import DEFAULT_BACKEND, SCHEMAS, bench_configs
from ..samplers.sampling import SamplingParams
from .args import non_negative_int, positive_int
from .model_spec import OFFLOADS, check_model_options
from .regimes import REGIMES, regime

DEFAULT_PROMPTS = [
    "a large red circle on a blue background",
    "a small yellow striped star on a noisy green background",
    "a white square on a black background",
    "a purple triangle on a noisy orange background",
]

# the sampling options: (option, the SamplingParams field, type, help); unset, each is the model's own
# (checked by SamplingParams.validated, the one check of a sampling value, before torch is imported)
SAMPLING = (("--cfg-scale", "cfg_scale", float, "classifier-free guidance scale (1: no guidance)"),
            ("--top-k", "top_k", int, "keep the k most likely image tokens (0: off, every token)"),
            ("--temperature", "temperature", float, "sampling temperature"),
            ("--top-p", "top_p", float, "nucleus sampling (1: off)"))


def add_arguments(ap) -> None:
    ap.add_argument("--regime", choices=list(REGIMES), default=None,
                    help="fixes the model and its sampling settings: demo (the demo model as it "
                    "samples), paper (the demo model calibrated to SJD's commit rate on Lumina-mGPT), flat (a "
                    "random-weight 8192-code target); without --regime and --model: demo")
    ap.add_argument("--model", default=None, help="built-in name, model folder, or tiny:V,HxW[,row_end][,key=value] "
                    "(a random-weight model; keys hidden, layers, heads, scale, seed); unset: the regime's model")
    ap.add_argument("--backends", nargs="+", default=bench_configs(),
                    help=f"configurations like ar  sjd:window=32  sjd_pac:window=64,tree_width=4  ar:compile=true "
                    f"(a parameter left out takes the backend's default; include `ar` for the speed-up column); "
                    f"backends: {', '.join(SCHEMAS)}; the default backend (API, node, demo): "
                    f"{DEFAULT_BACKEND}")
    ap.add_argument("--windows", type=positive_int, nargs="+",
                    help="run each configuration without an explicit window once per window (e.g. 16 32 64)")
    ap.add_argument("--prompts", help=f"file with one prompt per line (unset: {len(DEFAULT_PROMPTS)} built-in prompts)")
    ap.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1],
                    help="seeds; every configuration runs every prompt with every seed")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="times the whole interleaved round runs (more samples per configuration)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (unset: the model's own choice)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="weights precision (unset: the model's own)")
    ap.add_argument("--quantize", default="none", choices=["none", "int8", "int4"],
                    help="weight-only quantization of the model folder's linear layers (not with --offload auto; "
                    f"{schema.DOCS_URL}/MODELS.md)")
    ap.add_argument("--resolution", default=None, help="WIDTHxHEIGHT of a model folder's images, e.g. 768x768 "
                    "(unset: the model's own size; a size the model does not offer is refused naming those it does)")
    ap.add_argument("--offload", default="none", choices=list(OFFLOADS), help="auto: the weights that do not fit "
                    "the GPU stay in CPU memory (transformers-format models, Emu3.5; slow)")
    ap.add_argument("--threads", type=positive_int, help="torch CPU threads (unset: the cores other processes leave "
                    "free, at least 1)")
    for option, _, kind, text in SAMPLING:
        ap.add_argument(option, type=kind, default=None, help=text + "; unset: the model's recommended one")
    ap.add_argument("--json", help="write the rows (and the run's settings) to this file")
    ap.add_argument("--both-modes", action="store_true", help="run each configuration that does not set "
                    "reproducible twice: reproducible=false and reproducible=true (same image as AR), side by side")
    ap.add_argument("--preview", action="store_true", help="also run each configuration with the node's live "
                    "preview (interleaved) and report its overhead")
    ap.add_argument("--quiet", action="store_true", help="no progress line per generation on stderr")


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


def run(args):
    sampling = {key: getattr(args, key) for _, key, _, _ in SAMPLING if getattr(args, key) is not None}
    SamplingParams(**sampling).validated()
    the_regime = chosen_regime(args.regime, args.model, sampling)
    for text in args.backends:  # every argument checked before torch is imported (cli/schema.py)
        try:
            cfg = schema.parse_config(text)
        except ValueError as e:
            raise ValueError(f"--backends: {e}") from None
        window = next((p for p in SCHEMAS[cfg["backend"]].params if p.name == "window"), None)
        for w in (args.windows or []) if window and "window" not in cfg else []:
            try:
                window.check(w)
            except ValueError as e:
                raise ValueError(f"--windows: {e}") from None
    if args.regime is None:
        check_model_options(args.model or "demo", args.dtype, args.quantize, args.resolution, args.offload,
                            args.device)
    elif args.resolution or args.offload != "none" or args.quantize != "none" or args.dtype:
        raise ValueError(f"--regime {args.regime} fixes the model: drop --resolution, --offload, --quantize, --dtype")
    if args.prompts and not os.path.isfile(args.prompts):
        raise ValueError(f"--prompts: no such file {args.prompts!r} (one prompt per line)")

    import torch

    from .benchmark import format_table, in_both_modes, parse_config, run as measure, with_windows
    from .machine import busy_note, choose_threads, machine
    from .model_spec import model_from_spec
    configs = with_windows([parse_config(c) for c in args.backends], args.windows)
    if args.both_modes:
        configs = in_both_modes(configs)
    if the_regime is not None:
        configs = the_regime.apply_run_options(configs)
        args.model, sampling = the_regime.model, dict(the_regime.sampling)
    args.model = args.model or "demo"
    args.threads = choose_threads(args.threads)
    torch.set_num_threads(args.threads)  # after the checks: a refused command changes nothing
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [line.strip() for line in f if line.strip()]
    model = model_from_spec(args.model, args.device, args.dtype, args.quantize, args.resolution, args.offload)
    t0 = time.time()
    rows = measure(model, configs, prompts, args.seeds, args.repeats, sampling=sampling, preview=args.preview,
                   log=None if args.quiet else (lambda s: print(s, file=sys.stderr)))
    meta = {"command": args.command_line, "model": args.model, "regime": the_regime.as_dict() if the_regime else None,
            "sampling": sampling, "prompts": prompts, "seeds": args.seeds, "repeats": args.repeats,
            "threads": args.threads, "device": str(model.device), **machine(),
            "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1)}
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
