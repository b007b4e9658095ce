"""`python -m specar.tooling shape-bench`: forward latency of L-token windows on a real 7B AR image model's shape
(random weights), and the sampling core's per-step cost against it.

Trained 7B weights cannot be downloaded here, and speed does not depend on the weights: a
random-weight model of Lumina-mGPT / Chameleon 7B's shape (hidden 4096, 32 layers, 32 heads,
MLP 11008, vocabulary 65536 of which 8192 image codes) in bf16 gives the real forward cost. We
time, with CFG as a batch of two on a context of `--context` tokens:
  - one forward of a chain of 1, 16, 32, 64 tokens (the step of AR and of windowed backends),
    logits of the image-code rows of the head only;
  - the sampling core's work per step: the real engine (`SpeculativeEngine`) generating a whole
    image of the family's geometry (48x48 codes plus row ends, 8192 codes, top-k 2000, CFG 3)
    on `FreeForwardModel`, a model whose forward is a tiny low-rank bigram, timed apart
    (profile=True) and subtracted. What is left is everything the engine does besides the
    forward: target distribution, verification, coupling re-drafts, tree building, drafting of
    new positions, bookkeeping and the step's one host read.
`--small` runs a tiny shape so the script itself is testable on a CPU (tooling/shapes.py).

`--roofline` times nothing: it prints a PROJECTION of GPU latency from a roofline model
(tooling/roofline.py) for Lumina-mGPT 7B at 768x768 in bf16 on A100 / H100: first published
latencies of the seeds' papers against the model's, then every backend of a `bench --json`
file (`--bench-json`) projected from its measured step compression and window / tree sizes.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Sequence

import torch

from . import roofline as rl
from ..cli.args import positive_int
from ..cli.machine import machine
from ..model_loaders.contract import ARImageModel, EncodedPrompt, ForwardOutput, ImageGeometry, Session
from ..samplers.backends import make_backend
from ..samplers.engine import SpeculativeEngine
from ..samplers.target import SamplingParams
from .shapes import SHAPES, random_decoder, sync


def timed(fn, repeats: int, device) -> float:
    """Seconds per call of `fn` (after one warm-up call), the device's queue drained before and after."""
    fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t) / repeats


class FreeForwardModel(ARImageModel):
    """The model contract with a forward that costs (almost) nothing: next-token logits are a
    fixed random rank-`rank` bigram of the input token, sharpened so that drafts are accepted
    at a realistic rate. Running the real engine on it times the sampling core alone."""

    name = "free-forward"

    def __init__(self, geometry: ImageGeometry, device, rank: int = 16, sharpness: float = 4.0, seed: int = 0):
        self.geometry = geometry
        self._device = torch.device(device)
        g = torch.Generator(device=self._device).manual_seed(seed)
        V = geometry.vocab_size
        n_ids = V + 1  # image codes and the row end
        self.emb = torch.randn(2, n_ids, rank, device=self._device, generator=g)  # cond, uncond
        self.out = torch.randn(rank, V, device=self._device, generator=g) * (sharpness / rank ** 0.5)

    @property
    def device(self) -> torch.device:
        return self._device

    def encode_prompt(self, text: str, negative_text: str = "") -> EncodedPrompt:
        return EncodedPrompt(cond=[0], uncond=[0], text=text, negative_text=negative_text)

    def _logits(self, tokens, cfg):
        cond = self.emb[0][tokens] @ self.out
        return ForwardOutput(cond=cond, uncond=self.emb[1][tokens] @ self.out if cfg else None)

    def start(self, prompt, batch, cfg, draft_capacity, captured=False) -> Session:
        first = self._logits(torch.zeros(batch, 1, dtype=torch.long, device=self._device), cfg)
        return Session(batch=batch, cfg=cfg, committed=torch.zeros(batch, dtype=torch.long, device=self._device),
                       first=first)

    def forward(self, session: Session, tokens: torch.Tensor, parents: Sequence[int]) -> ForwardOutput:
        return self._logits(tokens, session.cfg)

    def commit(self, session: Session, path, length) -> None:
        session.committed = session.committed + length


def forward_cost(shape: dict, device, dtype, context: int, windows, repeats: int) -> list:
    """Forward latency of a chain of L+1 tokens (L=1: one token) after `context` cached tokens,
    CFG as a batch of two, per window L."""
    T_max = max(windows) + 1
    model = random_decoder(shape, device, dtype, context + T_max + 8)
    image_rows = slice(4, 4 + shape["image_codes"])
    rows = 2  # CFG: conditional and unconditional
    S = context + T_max + 1
    cache = model.new_cache(rows, S)
    gen = torch.Generator(device=device).manual_seed(0)
    results = []
    with torch.inference_mode():
        ctx = torch.randint(0, shape["vocab_size"], (rows, context), device=device, generator=gen)
        pos = torch.arange(context, device=device).expand(rows, -1)
        mask = (torch.arange(S, device=device)[None, :] <= torch.arange(context, device=device)[:, None])[None]
        model.hidden_states(ctx, pos, mask.expand(rows, -1, -1), cache, pos)
        for L in windows:
            T = L if L == 1 else L + 1  # window L: pending token + L drafts
            tok = torch.randint(0, shape["image_codes"], (rows, T), device=device, generator=gen)
            slots = context + torch.arange(T, device=device).expand(rows, -1)
            m = (torch.arange(S, device=device)[None, :] <= slots[0][:, None])[None].expand(rows, -1, -1)

            def fwd():  # logits of the image-code rows of the head only, as the adapters compute them
                h = model.hidden_states(tok, slots, m, cache, slots)
                return h @ model.lm_head.weight[image_rows].T

            results.append({"window": L, "tokens_per_forward": T, "forward_ms": 1e3 * timed(fwd, repeats, device)})
    return results


# per-step sampling-core cost is measured for these engine configurations
CORE_CONFIGS = [("ar", {}), ("sjd", {"window": 16}), ("sjd", {"window": 32}), ("sjd", {"window": 64}),
                ("scd", {"window": 64, "coupling": "maximal"}), ("scd", {"window": 64, "coupling": "gumbel"}),
                ("sjd_pac", {"window": 64})]


def core_cost(shape: dict, device, seeds=(0, 1)) -> list:
    """The engine's time per step outside the forward, per configuration (mean over `seeds`)."""
    grid = shape["grid"]
    model = FreeForwardModel(ImageGeometry(grid, grid, shape["image_codes"], row_end=True), device)
    sampling = SamplingParams(cfg_scale=3.0, top_k=shape["top_k"])
    rows = []
    for name, params in CORE_CONFIGS:
        spec = make_backend(name, **params)
        per_step, compression = [], []
        for seed in (seeds[0],) + tuple(seeds):  # the first run is a warm-up
            with torch.inference_mode():
                _, st = SpeculativeEngine(model, spec, sampling, seed, 1, profile=True).run(model.encode_prompt(""))
            per_step.append(st.overhead_s / st.nfe)
            compression.append(st.step_compression)
        rows.append({"backend": name, "params": spec.params(), "window": spec.params().get("window") or 1,
                     "core_ms": 1e3 * sum(per_step[1:]) / len(seeds),
                     "step_compression_free_model": sum(compression[1:]) / len(seeds)})
    return rows


def add_arguments(ap) -> None:
    ap.add_argument("--shape", default="chameleon-7b", choices=list(SHAPES), help="the model shape timed")
    ap.add_argument("--small", action="store_true", help="the tiny 'small' shape (CPU check of the script)")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (unset: cuda where there is one, else cpu)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="weights precision")
    ap.add_argument("--context", type=positive_int, default=2000, help="tokens already in the KV cache")
    ap.add_argument("--windows", type=positive_int, nargs="+", default=[1, 16, 32, 64], help="chain lengths timed")
    ap.add_argument("--repeats", type=positive_int, default=20, help="forwards timed per window")
    ap.add_argument("--json", help="write the results to this file")
    ap.add_argument("--roofline", action="store_true",
                    help="time nothing: print the roofline PROJECTION of GPU latency (published vs projected, "
                         "then each backend of --bench-json)")
    ap.add_argument("--bench-json", default=rl.DEFAULT_BENCH_JSON,
                    help="--roofline: the `bench --json` file whose step compressions are projected")
    ap.add_argument("--gpus", nargs="+", default=["a100", "h100"], choices=list(rl.GPUS),
                    help="--roofline: the GPUs our backends are projected on")


def run(args):
    if args.roofline:
        return roofline_report(args)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA GPU is available here; use --device cpu")
    shape = SHAPES["small" if args.small else args.shape]
    dtype = getattr(torch, args.dtype)
    results = forward_cost(shape, device, dtype, args.context, args.windows, args.repeats)
    V = shape["image_codes"]
    core = core_cost(shape, device)
    fwd_ms = {r["window"]: r["forward_ms"] for r in results}
    for c in core:  # the step's cost at the nearest measured window at or above the config's
        w = min((x for x in fwd_ms if x >= c["window"]), default=max(fwd_ms))
        c["forward_ms_at_window"] = fwd_ms[w]
        c["core_share"] = c["core_ms"] / (c["core_ms"] + fwd_ms[w])
    base = results[0]["forward_ms"]
    print(f"shape {args.shape if not args.small else 'small'}, {args.dtype}, device {device}, context {args.context}, CFG batch 2")
    print(f"{'window':>6s} {'tokens':>6s} {'forward ms':>10s} {'x 1-token':>9s}")
    for r in results:
        print(f"{r['window']:6d} {r['tokens_per_forward']:6d} {r['forward_ms']:10.2f} {r['forward_ms'] / base:9.2f}")
    grid = shape["grid"]
    print(f"\nsampling core per step (real engine, {grid}x{grid} codes + row ends, {V} codes, top-k {shape['top_k']}, CFG 3)")
    print(f"{'configuration':34s} {'core ms':>8s} {'forward ms':>10s} {'core share':>10s}")
    for c in core:
        label = c["backend"] + "".join(f" {k}={v}" for k, v in c["params"].items() if k in ("window", "coupling"))
        print(f"{label:34s} {c['core_ms']:8.2f} {c['forward_ms_at_window']:10.2f} {100 * c['core_share']:9.1f}%")
    if args.json:
        meta = {"command": args.command_line, "shape": "small" if args.small else args.shape, "dtype": args.dtype,
                "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                **machine(), "context": args.context, "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": results, "core": core}, f, indent=1)
    return results, core


def roofline_report(args) -> dict:
    """Print (and with --json write) the projection tables; nothing is timed."""
    try:
        with open(args.bench_json) as f:
            bench = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--bench-json {args.bench_json!r}: cannot read a bench JSON file ({e})") from None
    launch_s = rl.fitted_launch_s()
    shape = rl.LUMINA_MGPT_7B
    print(f"GPU latency PROJECTION (roofline model, nothing measured, no GPU used): {shape.name} "
          f"(hidden {shape.hidden}, {shape.layers} layers, MLP {shape.mlp}, vocab {shape.vocab}), bf16, CFG 2 rows")
    for g in rl.GPUS.values():
        print(f"  {g.name}: {g.bandwidth / 1e9:,.0f} GB/s, {g.bf16_flops / 1e12:,.1f} TFLOP/s bf16 ({g.source})")
    e = rl.EFFICIENCY
    print(f"  assumed efficiencies: bandwidth {e.bandwidth_eff}, tensor FLOPs {e.flops_eff}; "
          f"{rl.forward_launches(shape)} launches per forward (eager transformers)")
    print(f"  fitted launch cost {launch_s * 1e6:.1f} us per launch, on the rows marked 'fit' (AR, A100); "
          f"every other row is a prediction")
    repro = rl.reproduce(launch_s=launch_s)
    print(f"\n{'source':52s} {'GPU':8s} {'method':36s} {'steps':>7s} {'T':>3s} {'published':>10s} "
          f"{'projection':>10s} {'error':>7s}  role")
    for r in repro:
        row, unit = r["row"], "s" if r["row"].latency_s is not None else "x"
        print(f"{row.source[:52]:52s} {row.gpu:8s} {row.method:36s} {row.steps:7.0f} {row.tokens:3d} "
              f"{r['published']:9.2f}{unit} {r['projected']:9.2f}{unit} {100 * r['rel_error']:+6.1f}%  "
              f"{'fit' if row.fit else 'predicted'}")
    sens = rl.sensitivity()
    print("\nsensitivity to the assumed efficiencies (launch cost refitted on the same AR rows each time):")
    for r in sens:
        print(f"  bandwidth {r['efficiency'].bandwidth_eff:.2f}, FLOPs {r['efficiency'].flops_eff:.2f}: launch "
              f"{r['launch_s'] * 1e6:5.1f} us, largest error of a predicted row {100 * r['max_abs_error']:5.1f}%")
    alone = rl.single_row_fits()
    print("fitted on one AR row alone instead (default efficiencies):")
    for r in alone:
        print(f"  {r['row'].source}: launch {r['launch_s'] * 1e6:5.1f} us, largest error of another row "
              f"{100 * r['max_abs_error']:5.1f}%")
    gpus = [rl.GPUS[g] for g in args.gpus]
    ours = []
    print(f"\nPROJECTION of our backends on {shape.name} 768x768 ({rl.IMAGE_CODES_768} codes), from the demo model's "
          f"measured step compression in {args.bench_json} (the 7B model's acceptance will differ)")
    head = " ".join(f"{g.name[:9] + ' s':>12s} {'x AR':>5s} {'no-launch s':>11s} {'drafter':>7s}" for g in gpus)
    print("(x AR: latency ratio to the ar row on the same GPU; no-launch s: the same steps without the launch "
          "term, the roofline alone, a bound for a graph-captured step; drafter: % of the time in the drafter network)")
    width = max([26] + [len(r.get("label", r.get("backend", ""))) for r in (bench.get("rows") or [])]
                if isinstance(bench, dict) else [26])  # whole labels: a regime run's labels are long
    print(f"{'kind':10s} {'backend':{width}s} {'compr.':>6s} {'T/fwd':>6s} {'forwards':>8s} {'drafter net':14s} {head}")
    rows = bench.get("rows") if isinstance(bench, dict) else None
    if not rows:
        raise ValueError(f"--bench-json {args.bench_json!r} has no 'rows' (write one with `bench --json`)")
    plans = [rl.backend_plan(row) for row in rows]
    ar = next((plan for row, plan in zip(rows, plans) if row["backend"] == "ar"), None)
    base = {g.name: rl.generation_seconds(shape, g, ar, launch_s) if ar else None for g in gpus}
    for row, plan in zip(rows, plans):
        cells, entry = [], {"label": row.get("label", row["backend"]), "backend": row["backend"], "kind": "projection",
                            "step_compression_total": row["step_compression_total"], "forwards": plan.forwards,
                            "tokens_per_forward": rl.mean_tokens(plan),
                            "drafter": plan.drafter.name if plan.drafter else None}
        for g in gpus:
            s = rl.generation_seconds(shape, g, plan, launch_s)
            bound = rl.generation_seconds(shape, g, plan, 0.0)
            undrafted = rl.generation_seconds(shape, g, replace(plan, drafter=None), launch_s)
            x = base[g.name] / s if base[g.name] else float("nan")
            cells.append(f"{s:12.2f} {x:5.2f} {bound:11.2f} {100 * (1 - undrafted / s):7.1f}")
            entry[g.name] = {"seconds": s, "speedup_vs_ar": x, "seconds_without_launch_cost": bound,
                             "drafter_share": 1 - undrafted / s}
        print(f"{'projection':10s} {row.get('label', row['backend']):{width}s} {row['step_compression_total']:6.2f} "
              f"{rl.mean_tokens(plan):6.1f} {plan.forwards:8.0f} {(plan.drafter.name if plan.drafter else '-'):14s} "
              + " ".join(cells))
        ours.append(entry)
    result = {"kind": "projection", "launch_s": launch_s, "bandwidth_eff": e.bandwidth_eff, "flops_eff": e.flops_eff,
              "published": [{"source": r["row"].source, "gpu": r["row"].gpu, "method": r["row"].method,
                             "steps": r["row"].steps, "tokens": r["row"].tokens, "fit": r["row"].fit,
                             "published": r["published"], "projected": r["projected"], "rel_error": r["rel_error"]}
                            for r in repro],
              "sensitivity": [{"bandwidth_eff": r["efficiency"].bandwidth_eff, "flops_eff": r["efficiency"].flops_eff,
                               "launch_s": r["launch_s"], "max_abs_error": r["max_abs_error"]} for r in sens],
              "single_row_fits": [{"source": r["row"].source, "launch_s": r["launch_s"],
                                   "max_abs_error": r["max_abs_error"]} for r in alone],
              "backends": ours, "bench_json": args.bench_json}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result
