"""`python -m specar.tooling compile-rows`: where the compiled CPU step should stop writing matrix products
as a multiply-and-sum (samplers/compiled_step/few_rows_matmul.py) and leave them to BLAS.

Times the model's compiled forward of a chain of T tokens, with CFG as a batch of two (2T rows
per matrix product), once with every product through BLAS's GEMM and once with every product as
the multiply-and-sum, plus the eager forward. Each setting is compiled once per chain length (a few
seconds each, cached on disk after the first run); the timings of the settings are taken round-robin
and the fastest round is kept, so a load spike from another process does not favour one setting.
The last row count at which the multiply-and-sum still wins is the limit to use
(`few_rows_matmul.MAX_ROWS`).
"""
from __future__ import annotations

import json
import time

import torch

from ..cli.args import positive_int
from ..cli.machine import machine
from ..cli.model_spec import model_from_spec
from ..samplers.compiled_step.few_rows_matmul import MAX_ROWS
from ..samplers.compiled_step.shape_compiled import CompileStats, ShapeCompiled

ALL_ROWS = 1 << 30  # a limit no forward reaches: every product as the multiply-and-sum
SETTINGS = {"eager": None, "gemm": 0, "mul-sum": ALL_ROWS}


def compiled_forward(model, few_rows: int = MAX_ROWS):
    """`model.forward` alone through one graph per (tokens shape, parents), for the commands that time
    the forward (compile-rows, gpu-check): on a session started with ``captured=True``, called in
    inference mode. Returns (forward(session, tokens, parents), its CompileStats)."""
    stats = CompileStats()

    def forward(session, tokens, parents):
        return model.forward(session, tokens, parents)

    graphs = ShapeCompiled(forward, model.device, "model forward", stats, few_rows)
    return (lambda session, tokens, parents:
            graphs((tuple(tokens.shape), tuple(parents)), session, tokens, parents)), stats


def add_arguments(ap) -> None:
    ap.add_argument("--model", default="demo", help="built-in name, model folder, or tiny:V,HxW[,row_end]")
    ap.add_argument("--tokens", type=positive_int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 17, 33],
                    help="chain lengths timed (rows per product: 2x with CFG)")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--calls", type=positive_int, default=40, help="forwards per timing")
    ap.add_argument("--rounds", type=positive_int, default=5, help="timings per setting (the fastest is kept)")
    ap.add_argument("--json", help="write the results to this file")


@torch.inference_mode()
def _forward_timer(model, forward, tokens: int, calls: int):
    """A function timing `calls` forwards (`forward`: compiled, or None: eager) of a `tokens`-token chain on
    one CFG session."""
    enc = model.encode_prompt("a red circle", "")
    session = model.start(enc, 1, True, draft_capacity=tokens, captured=forward is not None)
    forward = forward or model.forward
    chain = torch.zeros(1, tokens, dtype=torch.long, device=model.device)
    parents = list(range(-1, tokens - 1))
    forward(session, chain, parents)  # compiles, when compiled

    @torch.inference_mode()
    def timed() -> float:
        t = time.perf_counter()
        for _ in range(calls):
            forward(session, chain, parents)
        return (time.perf_counter() - t) / calls

    return timed


def run(args):
    torch.set_num_threads(args.threads)
    models = {}
    for name, few_rows in SETTINGS.items():  # one model object per setting: each keeps its own graphs
        model = model_from_spec(args.model)
        models[name] = (model, None if few_rows is None else compiled_forward(model, few_rows)[0])
    rows = []
    for T in args.tokens:
        timers = {name: _forward_timer(m, forward, T, args.calls) for name, (m, forward) in models.items()}
        best = {name: float("inf") for name in timers}
        for _ in range(args.rounds):
            for name, timer in timers.items():
                best[name] = min(best[name], timer())
        rows.append({"tokens": T, "rows": 2 * T, **{f"{name}_ms": round(1e3 * s, 4) for name, s in best.items()}})
    wins = [r["rows"] for r in rows if r["mul-sum_ms"] < r["gemm_ms"]]
    print(f"compiled forward of a T-token chain, CFG (2T rows per product), {args.threads} threads, model {args.model}")
    print(f"{'tokens':>6s} {'rows':>5s} {'eager ms':>9s} {'gemm ms':>8s} {'mul-sum ms':>10s} {'gemm/mul-sum':>12s}")
    for r in rows:
        print(f"{r['tokens']:6d} {r['rows']:5d} {r['eager_ms']:9.3f} {r['gemm_ms']:8.3f} {r['mul-sum_ms']:10.3f} "
              f"{r['gemm_ms'] / r['mul-sum_ms']:12.2f}")
    print(f"multiply-and-sum faster at rows: {wins or 'none'}")
    if args.json:
        meta = {"command": args.command_line, "model": args.model, "threads": args.threads, "calls": args.calls,
                "rounds": args.rounds, **machine(), "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows
