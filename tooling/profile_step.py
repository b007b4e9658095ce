"""Where a decode step's time goes: the operators of one generation under torch.profiler, per step.

    python tooling/profile_step.py --backends ar scd --compile --threads 2

For each backend: two generations warm up (and compile, with --compile), a third is timed, a fourth
runs under the profiler; the table lists the operators with the most self CPU time, in milliseconds
per decode step (self time / the generation's forwards; the prefill is in the totals). With --compile
the inductor kernels are named (`cpp.enable_kernel_profile`). A profile slows what it measures: compare
shares within one table, not its milliseconds with a benchmark's.
"""
from __future__ import annotations

import argparse
import time

PROMPT = "a large red circle on a blue background"


def profile_backend(model, backend: str, compile: bool, rows: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from specar import generate
    for seed in range(2):
        generate(model, PROMPT, backend=backend, seed=seed, options=dict(compile=compile))
    t = time.perf_counter()
    timed = generate(model, PROMPT, backend=backend, seed=5, options=dict(compile=compile))
    wall = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = generate(model, PROMPT, backend=backend, seed=7, options=dict(compile=compile))
    steps = max(out.stats.nfe - 1, 1)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\n{backend}{' compiled' if compile else ''}: {timed.stats.nfe} forwards, {wall:.3f} s unprofiled "
          f"({1e3 * timed.stats.decode_s / max(timed.stats.nfe - 1, 1):.2f} ms of decode per step); profiled "
          f"{total / 1e3:.1f} ms of self CPU time, {total / 1e3 / steps:.2f} ms per step")
    print(f"{'operator':64s} {'calls/step':>10s} {'ms/step':>8s} {'share':>6s}")
    for e in events[:rows]:
        print(f"{e.key[:64]:64s} {e.count / steps:10.1f} {e.self_cpu_time_total / 1e3 / steps:8.3f} "
              f"{100 * e.self_cpu_time_total / total:5.1f}%")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--backends", nargs="+", default=["ar", "scd"])
    ap.add_argument("--compile", action="store_true", help="compile=True (the whole decode step as one graph per plan)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=14, help="operators listed per backend")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    if args.compile:
        import torch._inductor.config as inductor_config
        inductor_config.cpp.enable_kernel_profile = True
    from specar import load_model
    model = load_model(args.model)
    print(f"model {args.model}, {args.threads} threads, torch {torch.__version__}")
    for backend in args.backends:
        profile_backend(model, backend, args.compile, args.rows)


if __name__ == "__main__":
    main()
