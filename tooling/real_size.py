"""`python -m specar.tooling real-size`: each family at the real width of a released checkpoint, checked.

For each family, a random-weight model is built from the published configuration of a real
checkpoint (real_size_builders.py: dimensions in `SPECS`, with their source), saved in the family's real
folder format, loaded through `specar.load_model` (the code path of a real folder),
then, in a fresh process per (family, precision) so that its peak memory is its own:
`generate` at the real resolution with a speculative backend for a few steps, the VQ decoder on a
full grid of codes at the real image size, and forwards of 1 and 17 tokens (CFG: 2 rows) timed.

Layers: a model that does not fit the memory budget runs with the real widths and FEWER layers
(`--layers`, recorded as "layers run / real"); time and memory of the decoder scale with the
layer count, the embeddings, heads and VQ are at full size. Weights are random: the images are noise,
the speed and memory are what the shapes cost. Results: a JSON (--json) and one line per run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from ..cli.args import positive_int
from ..cli.machine import machine
from ..samplers.backends import BACKENDS
from .real_size_builders import SPECS, Spec, build_folder
from specar import make_backend

WINDOW = 16  # the speculative backend's window in the generation of each run


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def module_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def decoder_layers(model):
    """The decoder's layer list of a loaded model (for the per-layer memory)."""
    tm = model.torch_module()
    for path in ("layers", "model.language_model.layers", "model.text_model.layers", "model.layers"):
        obj = tm
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise ValueError(f"no decoder layers found in {type(tm).__name__}")


def measure(folder: str, dtype: str, quantize: str, steps: int, backend: str, repeats: int, decode: bool = True) -> dict:
    """Load `folder`, generate a few steps, decode a full grid, time 1- and 17-token forwards."""
    from .. import load_model
    from ..samplers.api import generate
    from ..samplers.engine import GenerationInterrupted
    with open(os.path.join(folder, "real_size.json")) as f:
        meta = json.load(f)
    rss0 = _peak_rss_bytes()
    t0 = time.perf_counter()
    model = load_model(folder, device="cpu", dtype=dtype, quantize=quantize, **meta["load"])
    load_s = time.perf_counter() - t0
    geo = model.geometry
    done = {"steps": 0}

    def progress(*_):
        done["steps"] += 1

    t0 = time.perf_counter()
    try:
        res = generate(model, SPECS_BY_FOLDER(folder).prompt, backend=make_backend(backend, window=WINDOW), seed=0,
                       progress=progress, interrupt=lambda: done["steps"] >= steps)
        tokens_done = int(res.tokens.numel())
    except GenerationInterrupted:
        tokens_done = None
    gen_s = time.perf_counter() - t0
    text, first = SPECS_BY_FOLDER(folder).prompt, model.preceding_stage()
    # a two-grid model (GLM-Image): the forwards are the last grid's, after a preceding grid of codes 0
    prompt = model.encode_prompt(text) if first is None else \
        model.prompt_after(text, torch.zeros(first.geometry.num_image_tokens, dtype=torch.long))
    times = {}
    with torch.inference_mode():
        for T in (1, 17):
            session = model.start(prompt, 1, True, draft_capacity=17)
            tokens = torch.randint(geo.vocab_size, (1, T))
            parents = [-1] + list(range(T - 1))
            model.forward(session, tokens, parents)  # warm-up
            ms = []
            for _ in range(repeats):
                t = time.perf_counter()
                model.forward(session, tokens, parents)
                ms.append((time.perf_counter() - t) * 1000)
            times[T] = statistics.median(ms)
    rss_before_decode = _peak_rss_bytes()  # the VQ decoder's activations at full size come next
    codes = torch.randint(geo.vocab_size, (1, geo.height, geo.width))
    t0 = time.perf_counter()
    images = model.decode_tokens(codes) if decode else None  # None: the model decodes no image here
    image = images[0] if images else None
    decode_s = time.perf_counter() - t0 if image is not None else None
    layers = decoder_layers(model)
    params = sum(p.numel() for p in model.torch_module().parameters())
    return dict(load_s=round(load_s, 2), generate_steps=done["steps"], generate_s=round(gen_s, 2),
                finished_tokens=tokens_done, decode_s=None if decode_s is None else round(decode_s, 2),
                image_size=list(image.size) if image is not None else None,
                decode_skipped=getattr(model, "decoder_problem", None) if decode and image is None else None,
                grid=[geo.height, geo.width], ms_forward_1=round(times[1], 1), ms_forward_17=round(times[17], 1),
                layers_run=len(layers), layer_bytes=module_bytes(layers[0]), model_bytes=module_bytes(model.torch_module()),
                params_stored=params, peak_rss_bytes=_peak_rss_bytes(), peak_rss_before_decode_bytes=rss_before_decode,
                rss_before_load_bytes=rss0)


def SPECS_BY_FOLDER(folder: str) -> Spec:  # noqa: N802 -- a lookup, named like the table it reads
    return SPECS[os.path.basename(os.path.normpath(folder))]


def real_params(spec: Spec, layers: int) -> int:
    """Parameters of the decoder at `layers` layers plus embeddings and head (per layer 4 d^2 + 3 d f; GLM-Image's
    vision encoder and VQ left out)."""
    d = spec.dims
    if spec.family == "llamagen":
        w, f, v = d["dim"], d["ffn"], d["codes"]
        per = 4 * w * w + 3 * w * f
        return layers * per + 2 * v * w
    w, f, v = d["hidden"], d["ffn"], d["vocab"]
    kv = w * d["kv"] // d["heads"]
    per = 2 * w * w + 2 * w * kv + 3 * w * f
    return layers * per + (v + d.get("head", v)) * w  # GLM-Image's head: its image rows only


def add_arguments(ap) -> None:
    ap.add_argument("--families", nargs="+", default=list(SPECS), choices=list(SPECS), help="which models")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "int8", "int4"], choices=["bf16", "int8", "int4"],
                    help="bf16 weights, or bf16 with int8 / int4 weight-only quantization")
    ap.add_argument("--layers", type=positive_int, default=None, help="decoder layers for every family (unset: "
                    "each family's budget in SPECS: the real count where it fits, else fewer)")
    ap.add_argument("--steps", type=positive_int, default=2, help="speculative steps of generate per run")
    ap.add_argument("--backend", default="sjd", choices=list(BACKENDS),
                    help=f"the speculative backend generate runs (window {WINDOW})")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed forwards per size (median)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch threads in each run")
    ap.add_argument("--workdir", default=None, help="where the model folders are written (unset: a temp folder)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--reduced", action="store_true", help="the CI test's tiny widths (checks the path, not the size)")
    ap.add_argument("--no-decode", action="store_true", help="skip the VQ decode (its full-size activations "
                    "dominate the peak memory of the large decoders)")
    ap.add_argument("--reuse", action="store_true", help="use a model folder already built in --workdir (same "
                    "--layers) instead of writing it again")
    ap.add_argument("--table", nargs="+", default=None, metavar="JSON", help="print the docs table of results JSONs "
                    "and exit")
    ap.add_argument("--child", nargs=3, metavar=("FOLDER", "QUANTIZE", "STEPS"), help=argparse.SUPPRESS)


def table(paths) -> str:
    """The table of results JSONs (docs/history/MODELS-journal.md, "Real size, checked"), with each run's int4 /
    int8 bytes per decoder layer as a share of its bf16 layer (same run)."""
    results = []
    for path in paths:
        with open(path) as f:
            results += json.load(f)["results"]
    data = {"results": results}
    rows = ["| model (checkpoint shape) | layers run / real | params as run / real | precision | decoder layer "
            "| weights held | peak RSS | ms / forward, 1 token | ms / forward, 17 tokens | image |", "|" + "---|" * 10]
    bf16 = {r["model"]: r["layer_bytes"] for r in data["results"] if r["precision"] == "bf16"}
    for r in data["results"]:
        share = f" ({r['layer_bytes'] / bf16[r['model']]:.0%} of bf16)" if r["precision"] != "bf16" and \
            r["model"] in bf16 else ""
        p_run = f"{r['params_as_run'] / 1e9:.2f} B" if r.get("params_as_run") else "-"
        rows.append(f"| {r['model']} ({r['checkpoint'].split(' ')[0]}) | {r['layers_run']} / {r['layers_real']} | "
                    f"{p_run} / {r['params_real'] / 1e9:.2f} B | {r['precision']} | "
                    f"{r['layer_bytes'] / 2 ** 20:.1f} MiB{share} | {r['model_bytes'] / 2 ** 30:.2f} GiB | "
                    f"{r['peak_rss_bytes'] / 2 ** 30:.2f} GiB | "
                    f"{r['ms_forward_1']:.0f} | {r['ms_forward_17']:.0f} | "
                    + (f"{r['image_size'][0]}x{r['image_size'][1]} |" if r["image_size"] else "not decoded |"))
    return "\n".join(rows)


def run(args) -> None:
    if args.table:
        print(table(args.table))
        return
    torch.set_num_threads(args.threads)
    if args.child:
        folder, quantize, steps = args.child
        print(json.dumps(measure(folder, "bf16" if not args.reduced else "fp32", quantize, int(steps), args.backend,
                                 args.repeats, decode=not args.no_decode)))
        return
    work = args.workdir or tempfile.mkdtemp(prefix="specar-real-size-")
    results = []
    for name in args.families:
        spec = SPECS[name]
        layers = args.layers or spec.run_layers
        t0 = time.perf_counter()
        folder = os.path.join(work, name)
        if not (args.reuse and os.path.isfile(os.path.join(folder, "real_size.json"))):
            folder = build_folder(name, work, layers=layers, reduced=args.reduced,
                                  dtype=torch.float32 if args.reduced else torch.bfloat16)
        build_s = time.perf_counter() - t0
        for prec in args.precisions:
            quantize = "none" if prec == "bf16" else prec
            cmd = [sys.executable, "-m", __package__, "real-size", "--child", folder, quantize, str(args.steps),
                   "--backend", args.backend, "--repeats", str(args.repeats), "--threads", str(args.threads)]
            cmd += ["--reduced"] if args.reduced else []
            cmd += ["--no-decode"] if args.no_decode else []
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"{name} {prec}: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(model=name, checkpoint=spec.checkpoint, source=spec.source, precision=prec,
                       layers_real=spec.layers, params_as_run=real_params(spec, layers) if not args.reduced else None,
                       params_real=real_params(spec, spec.layers), build_s=round(build_s, 1))
            results.append(row)
            _write_json(args, results)  # after every run: a long run stopped early keeps what it measured
            print(f"{name:15s} {prec:5s} layers {row['layers_run']}/{spec.layers} image {row['image_size']} "
                  f"peak {row['peak_rss_bytes'] / 2 ** 30:.2f} GiB  layer {row['layer_bytes'] / 2 ** 20:.1f} MiB  "
                  f"fwd1 {row['ms_forward_1']:.0f} ms  fwd17 {row['ms_forward_17']:.0f} ms  "
                  f"steps {row['generate_steps']} ({row['generate_s']:.1f} s)  decode {row['decode_s']} s", flush=True)
        if not args.workdir:
            import shutil
            shutil.rmtree(folder, ignore_errors=True)


def _write_json(args, results) -> None:
    if args.json:
        meta = dict(command=args.command_line, **machine(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    threads=args.threads, results=results)
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)


__all__ = ["measure", "real_params", "table"]
