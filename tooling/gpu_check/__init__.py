"""`python -m specar.tooling gpu-check`: the CUDA path exercised in one command, each stage isolated.

Stages (stages.py), each in its own Python process with its own time budget (runner.py), so that a
failure (an exception, a CUDA error or device-side assert that poisons the process's CUDA context,
an out-of-memory, a crash) or a stage that runs past its budget is recorded and the next stage
still runs; in this order (the default run on CUDA: environment, exactness, images, quantized, projection;
a dry run: every stage):
  environment  torch / CUDA / driver versions, the device, bf16, SDPA kernels, a compile smoke test,
               measured copy bandwidth and bf16 matrix-product rate
  exactness    chi-square vs exact enumeration for every registered lossless backend on tiny models on
               the device (a correct sampler fails the stage with probability < 1e-4), and a planted
               bug the same test must catch
  images       generations at released models' shapes (tooling/released_models.py: Janus-Pro-7B, Emu3-Gen,
               Lumina-mGPT 2.0, GLM-Image's AR stage at 1024x1024: preview grid then image grid, tokens only;
               random bf16 weights built on the device by each family's classes, loaded
               through its loader), every registered backend eager, then compiled ones: seconds of a whole image
               or of its first rows (stated), ms per step (median, p90), compile seconds, CUDA-graph re-recordings
               and skips inside the timed run, peak memory, tokens vs AR's in the same-image mode with the
               batch-invariant mode as set and flipped, and shape-pinned (each backend at its verify width against
               AR padded to it, ms per step of both); ratios to AR written as each row finishes (images.py)
  quantized    int8 / int4 weight-only (ours; torchao's in each int4 packing, bitsandbytes' where installed) vs bf16
               at the 7B shape: forward ms at 1, 2, 17, 34 and 66 matrix rows (AR to window 32, with and without
               CFG), peak memory, the exactness case (plain and shape-pinned) on each target (quantized.py)
  backends     every registered backend eager vs compiled (the model's compiled step: CUDA graphs, mode
               reduce-overhead) on the demo model: latency and its ratio to AR's, forwards, compression,
               compile time, graph breaks, recompiles, dynamo's counters, tokens equal to eager's;
               compiled in the plan's order: AR, then what no committed GPU report has compiled
  forward_7b   forward latency of a random-weight Lumina-mGPT-7B-shape model in bf16 for 1..65
               tokens x 2 CFG rows over a full static KV cache, eager and compiled, and the roofline
               projection (tooling/roofline.py) re-fitted to them
  projection   the images stage's step costs x the step counts of committed regime runs, beside published
               anchors, every row labelled a projection (projection.py)
Every stage records its peak device memory (torch.cuda.max_memory_allocated, reset per stage),
what torch logged about graph breaks, recompiles and CUDA graphs, and torch._dynamo's counters.
A stage that met a CUDA error is run once more with CUDA_LAUNCH_BLOCKING=1 after the other stages
(with what is left of the total budget), so that its traceback names the kernel that failed.

Writes gpu_check.json and gpu_check.md to --out, and again while each stage runs, so that a command killed
from outside leaves what it measured. `--plan-only` prints each stage's plan and its predicted seconds
against the budget (plan.py: from the committed GPU reports) and runs nothing. `--dry-run` runs the same
stages on the CPU at tiny shapes (tiny widths at each released model's real geometry, few positions, a tiny
Llama in place of the 7B shape, few samples, compiled AR only).

The maintainer's commands (from the repository root; `make gpu-check` imports this checkout without installing):
  make gpu-check GPU_CHECK_ARGS=--plan-only                      # the plan, predicted seconds per stage; no GPU
  make gpu-check GPU_CHECK_OUT=docs/figures/gpu_<card>_<letter>   # the default run (555 s predicted, 560 budgeted)
  python -m specar.tooling gpu-check --dry-run --out output/gpu-check-dry   # the whole command on the CPU
Follow-ups, each a separate lease (add --out docs/figures/gpu_<card>_<letter>; the report records its date):
  python -m specar.tooling gpu-check --stages images --image-families emu3-gen --image-rows 8 --budget 560 \
      --stage-budget images=540                                   # Emu3-Gen, its first 8 rows
  python -m specar.tooling gpu-check --stages images projection --image-families janus-pro-7b \
      --image-compile-backends ar auto scd sjd_pac --budget 560 --stage-budget images=540   # compiled backends
  python -m specar.tooling gpu-check --stages images --image-families lumina-mgpt-2-7b --image-rows 0 \
      --image-backends ar auto --image-compile-backends --budget 560 --stage-budget images=540   # a whole
                                                                  # Lumina-mGPT 2.0 image, eager AR and auto
  python -m specar.tooling gpu-check --stages images projection --image-families glm-image --image-rows 0 \
      --image-compile-backends --budget 560 --stage-budget images=540   # GLM-Image's whole 1024x1024 image (both
                                                                  # grids, 1,280 positions), every backend eager
  python -m specar.tooling gpu-check --stages backends forward_7b # the demo model and the 7B forwards (as 2026-11-26)
"""
from __future__ import annotations

import json
import os
import sys

from ...cli.args import non_negative_int, positive_float, positive_int
from ..roofline import DEFAULT_BENCH_JSON

# what a run does on CUDA and in the dry run (on the CPU, tiny shapes): the defaults of the options that differ.
# CUDA budgets: seconds per stage, from the stage times of the committed H200 runs (plan.py predicts them); the
# whole check ends within 9 minutes with process starts. Dry run: generous, a loaded shared machine must not cut a
# tiny stage; compiles only where quick (AR's one shape, one 7B-shape token count)
# GLM-Image in the default run (1024x1024, what is left of the 560 s): AR and the default backend eager over the first
# 10 rows of its preview grid (160 of 1,280 positions; the KV cache and every shape the whole image's), no compiled,
# flipped or pinned run; the whole image with every backend is a follow-up lease (below). Emu3.5-Image (34 B, 62 GiB
# of bf16 weights on the device; about 85 s for AR and auto, past what the 420 s leave) runs in the dry run and in
# a lease of its own, which the plan lists after the total: --image-families emu3.5-image times every backend over
# its first row of 64 codes (65 of 4,160 positions; the projection stage scales the step costs to the whole
# image), --image-rows 0 the whole image
GLM_DEFAULT_ROWS = 10
PROFILES = {
    "cuda": dict(device="cuda", total_budget=560.0, samples=16000, dtype="bfloat16", compile_all=True,
                 budgets={"environment": 30.0, "exactness": 30.0, "images": 420.0, "quantized": 120.0,
                          "backends": 290.0, "forward_7b": 170.0, "projection": 15.0},
                 stages=["environment", "exactness", "images", "quantized", "projection"],
                 tokens_7b=list(range(1, 66)), compiled_tokens_7b=[1, 33, 65, 17, 9, 2, 49, 5], repeats_7b=10,
                 image_families=["janus-pro-7b", "lumina-mgpt-2-7b", "glm-image"],
                 image_rows={"lumina-mgpt-2-7b": 2, "emu3-gen": 2, "glm-image": GLM_DEFAULT_ROWS, "emu3.5-image": 1},
                 image_family_backends={"glm-image": "base and default"},
                 image_invariant_rows=1, image_positions_cap=None, compile_images="base", image_pinned_families=None,
                 quant_rows=[1, 2, 17, 34, 66], repeats_quant=10),
    "dry": dict(device="cpu", total_budget=1200.0, samples=1500, dtype="float32", compile_all=False,
                budgets={"environment": 120.0, "exactness": 240.0, "images": 450.0, "quantized": 120.0,
                         "backends": 400.0, "forward_7b": 300.0, "projection": 60.0},
                stages=None,  # every stage
                tokens_7b=[1, 2, 3, 5, 9, 17, 33], compiled_tokens_7b=[1], repeats_7b=3,
                image_families=None,
                image_rows={"janus-pro-7b": 1, "lumina-mgpt-2-7b": 1, "emu3-gen": 1, "emu3.5-image": 1},
                image_family_backends={"glm-image": "base and default"},
                image_invariant_rows=1, image_positions_cap=8, compile_images="base", image_pinned_families=1,
                quant_rows=[1, 2, 17, 34, 66],
                repeats_quant=2),
}
PAPER_PRESETS = {"sjd_pac": "paper"}  # the images stage runs these backends at their paper's setting (the ask)
STAGE_NAMES = list(PROFILES["cuda"]["budgets"])  # every stage, in the order they run (stages.STAGES)


def _both(key: str, fmt=str) -> str:
    """An option's two defaults, for its help: '<on CUDA>; with --dry-run: <dry run>'."""
    return f"{fmt(PROFILES['cuda'][key])}; with --dry-run: {fmt(PROFILES['dry'][key])}"


def add_arguments(ap) -> None:
    words = lambda xs: " ".join(map(str, xs))  # noqa: E731
    ap.add_argument("--out", default="output/gpu-check", help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: the same stages on the CPU at tiny shapes (checks the command itself)")
    ap.add_argument("--plan-only", action="store_true", help="print each stage's plan and its predicted seconds "
                    "against the budget (from the committed GPU reports), run nothing; needs no GPU")
    ap.add_argument("--device", default=None, help=f"cuda, cuda:N (unset: {_both('device')})")
    ap.add_argument("--stages", nargs="+", choices=STAGE_NAMES, default=None,
                    help=f"stages to run, in the order given (projection reads images: after it); all: "
                    f"{' '.join(STAGE_NAMES)} (unset: "
                    f"{' '.join(PROFILES['cuda']['stages'])}; with --dry-run: every stage)")
    ap.add_argument("--no-compile", action="store_true", help="skip every torch.compile (eager only)")
    ap.add_argument("--budget", type=positive_float, default=None,
                    help=f"total seconds (unset: {_both('total_budget', '{:g}'.format)})")
    ap.add_argument("--stage-budget", action="append", default=None, metavar="STAGE=SECONDS",
                    help="one stage's time budget (repeatable), e.g. backends=400 (unset: " +
                    ", ".join(f"{n}={PROFILES['cuda']['budgets'][n]:g}" for n in STAGE_NAMES) + " on CUDA)")
    ap.add_argument("--samples", type=positive_int, default=None,
                    help=f"images per chi-square case (unset: {_both('samples')})")
    ap.add_argument("--backends", nargs="+", default=None, metavar="BACKEND",
                    help="the backends stage's backends, in order; compiled runs in this order too (unset: every "
                    "registered backend, AR first, then those no committed GPU report has compiled)")
    ap.add_argument("--compiled-tokens-7b", nargs="+", type=positive_int, default=None, metavar="T",
                    help="the forward_7b stage's compiled token counts, in order "
                    f"(unset: {_both('compiled_tokens_7b', words)})")
    from ..released_models import RELEASED
    ap.add_argument("--image-families", nargs="+", choices=list(RELEASED), default=None, metavar="MODEL",
                    help=f"the images stage's released models ({', '.join(RELEASED)}; unset: "
                    f"{_both('image_families', lambda x: words(x or list(RELEASED)))})")
    ap.add_argument("--image-backends", nargs="+", default=None, metavar="BACKEND",
                    help="the images stage's backends, in order (unset: every registered backend, AR first)")
    ap.add_argument("--image-compile-backends", nargs="*", default=None, metavar="BACKEND",
                    help="the images stage's backends also run compiled, in order (unset: AR; none: no compiled run)")
    ap.add_argument("--image-rows", type=non_negative_int, default=None, metavar="N",
                    help="time the first N rows of each image (GLM-Image: its preview grid's rows first; 0: the "
                    "whole image; unset: " +
                    ", ".join(f"{k} {v}" for k, v in PROFILES["cuda"]["image_rows"].items()) + ", else the whole "
                    f"image; with --dry-run: the first {PROFILES['dry']['image_positions_cap']} positions)")
    ap.add_argument("--image-weights", choices=["memory", "saved"], default="memory",
                    help="the images stage's random weights: memory, built on the device while the family loader "
                    "runs; saved, written in the family's file format and loaded back (slow at released sizes: built "
                    "on the CPU, written, read)")
    ap.add_argument("--seed", type=non_negative_int, default=0,
                    help="seed of the backends and images stages' generations")
    ap.add_argument("--bench-json", default=DEFAULT_BENCH_JSON,
                    help="the `bench --json` file whose step compressions the refitted projection uses")
    ap.add_argument("--in-process", action="store_true",
                    help="run the stages in this process (no crash isolation; time budgets by SIGALRM): for tests "
                         "and debugging")


def parse_budgets(items) -> dict:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or name not in STAGE_NAMES:
            raise ValueError(f"--stage-budget must be STAGE=SECONDS with STAGE one of {', '.join(STAGE_NAMES)}, "
                             f"got {item!r}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--stage-budget {item!r}: SECONDS must be a number") from None
        if out[name] <= 0:
            raise ValueError(f"--stage-budget {item!r}: SECONDS must be > 0")
    return out


def options_from_args(args, reports=None) -> dict:
    """The run's options as plain data (what each stage process receives), with its plan (plan.py) from
    `reports` (default: the committed GPU reports)."""
    import torch

    from ...samplers.backends import SCHEMAS
    from .plan import RATIO_BASE, backend_order, committed_reports, plan
    profile = PROFILES["dry" if args.dry_run else "cuda"]
    device = args.device or profile["device"]
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available() and not args.plan_only:
        raise ValueError(f"--device {device}: no CUDA GPU is available here; run with --dry-run to check the "
                         f"command on the CPU, or --plan-only to see the plan")
    if dev.type != "cuda" and not args.dry_run:
        raise ValueError(f"--device {device}: gpu-check measures a CUDA device; use --dry-run for the CPU")
    budgets = {**profile["budgets"], **parse_budgets(args.stage_budget or ())}
    for flag in ("backends", "image_backends", "image_compile_backends"):
        unknown = [b for b in getattr(args, flag) or () if b not in SCHEMAS]
        if unknown:
            raise ValueError(f"--{flag.replace('_', '-')}: unknown backend(s) {unknown}; allowed: {sorted(SCHEMAS)}")
    reports = committed_reports() if reports is None else reports
    backends = list(args.backends or backend_order(reports))
    options = {
        "dry_run": args.dry_run, "device": device, "stages": list(args.stages or profile["stages"] or STAGE_NAMES),
        "compile": not args.no_compile,
        "budgets": budgets, "total_budget": args.budget or profile["total_budget"], "seed": args.seed,
        "bench_json": args.bench_json, "samples": args.samples or profile["samples"],
        "dtype": profile["dtype"],  # the backends stage's model (CUDA: the product's bf16)
        "dtype_7b": "bfloat16",  # the 7B shape: bf16 on the CPU too, so that the dry run goes through the bf16 path
        "backends": backends, "ratio_base": RATIO_BASE,
        "compile_backends": [b for b in backends if profile["compile_all"] or b == RATIO_BASE],
        "tokens_7b": list(profile["tokens_7b"]),
        "compiled_tokens_7b": list(args.compiled_tokens_7b or profile["compiled_tokens_7b"]),
        "repeats_7b": profile["repeats_7b"],
        **_image_options(args, profile, backends), "quant_rows": list(profile["quant_rows"]),
        "repeats_quant": profile["repeats_quant"],
    }
    options["plan"] = plan(options, reports)
    return options


def options_from_argv(argv, reports=None) -> dict:
    """`options_from_args` of a gpu-check command line (without the command's name): for tests and scripts."""
    from .. import parser
    return options_from_args(parser("gpu-check").parse_args(["gpu-check", *argv]), reports)


def _image_options(args, profile: dict, backends: list) -> dict:
    """The images stage's options: families, rows timed, backends (the registry's, AR first), which compile, which
    also run with the batch-invariant mode flipped (AR and the default backend), the paper presets."""
    from ...samplers.backends import DEFAULT_BACKEND, SCHEMAS
    from ..released_models import RELEASED
    from .plan import RATIO_BASE
    families = list(args.image_families or profile["image_families"] or RELEASED)
    rows = {f: (args.image_rows or None) if args.image_rows is not None else profile["image_rows"].get(f)
            for f in families}
    image_backends = list(args.image_backends or backends)
    if args.image_compile_backends is not None:
        compiled = list(args.image_compile_backends)
    else:
        compiled = [RATIO_BASE] + ([DEFAULT_BACKEND] if profile["compile_images"] == "base and default" else [])
    # a family run with AR and the default backend only (eager: no compiled, flipped or pinned run), where the
    # families are the profile's (a run that names its families runs every backend on each)
    limited = {f: [b for b in (RATIO_BASE, DEFAULT_BACKEND) if b in image_backends]
               for f in profile["image_family_backends"] if f in families} if not args.image_families else {}
    return {"image_families": families, "image_rows": rows, "image_backends": image_backends,
            "image_family_backends": limited,
            "image_weights": args.image_weights,
            "image_compile_backends": [b for b in compiled if b in image_backends],
            "image_invariant_backends": [b for b in (RATIO_BASE, DEFAULT_BACKEND) if b in image_backends],
            # shape-pinned rows (AR: its runs per width) in every family; the dry run: the first family only
            "image_pinned_backends": [b for b in image_backends if b != RATIO_BASE],
            "image_pinned_families": families[:profile["image_pinned_families"]],
            "image_invariant_rows": profile["image_invariant_rows"],
            "image_positions_cap": profile["image_positions_cap"],
            "image_presets": {b: p for b, p in PAPER_PRESETS.items() if b in SCHEMAS}}


def write_report(report: dict, out: str) -> str:
    """gpu_check.json and gpu_check.md in `out` (atomic: a kill mid-write leaves the previous ones); the markdown."""
    from .report import markdown
    from .runner import json_default
    text = markdown(report)
    for name, content in (("gpu_check.json", json.dumps(report, indent=1, default=json_default)),
                          ("gpu_check.md", text)):
        path = os.path.join(out, name)
        with open(path + ".tmp", "w") as f:
            f.write(content)
        os.replace(path + ".tmp", path)
    return text


def run(args):
    from .plan import plan_text
    from .runner import run_check
    options = options_from_args(args)
    print(plan_text(options["plan"], verbose=args.plan_only), file=sys.stdout if args.plan_only else sys.stderr)
    if args.plan_only:
        return options["plan"]
    os.makedirs(args.out, exist_ok=True)
    report = run_check(options, in_process=args.in_process, log=lambda s: print(s, file=sys.stderr, flush=True),
                       command=args.command_line, on_update=lambda r: write_report(r, args.out))
    print(write_report(report, args.out))
    print(f"wrote {os.path.join(args.out, 'gpu_check.json')} and gpu_check.md", file=sys.stderr)
    return report


__all__ = ["PAPER_PRESETS", "PROFILES", "STAGE_NAMES", "add_arguments", "options_from_args", "options_from_argv", "run",
           "write_report"]
