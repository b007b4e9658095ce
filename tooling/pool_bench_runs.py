"""Pool the rows of several `bench --json` runs of one regime (other seed sets) and print each configuration's
pooled tokens per forward against a reference configuration of the same backend.

    python tooling/pool_bench_runs.py --reference preset=paper RUN.json [RUN.json ...]

Rows are matched across files by backend and parameters (the label's `key=value` list, order and case of
values ignored); each row's reference is its backend's row marked by --reference that shares the most
parameters with it. Pooled tokens per forward = all image tokens / all forwards of the matched rows (every image of
one model has the same image tokens, so this is sum(images) / sum(images / step_compression_total)). Only
configurations present in every file are pooled. Used for docs/BENCHMARKS.md "Defaults chosen on every regime".
"""
from __future__ import annotations

import argparse
import json


def config_key(label: str) -> tuple:
    backend, _, params = label.partition(":")
    items = (p.split("=", 1) for p in params.split(",") if p)
    return backend, frozenset((k, v.lower()) for k, v in items)


def pooled(runs: list) -> dict:
    """{config key: pooled tokens per forward} over the configurations every run has."""
    rows = [{config_key(r["label"]): r for r in run["rows"]} for run in runs]
    common = set(rows[0]).intersection(*rows[1:])
    out = {}
    for key in common:
        images = sum(f[key]["samples"] for f in rows)
        forwards = sum(f[key]["samples"] / f[key]["step_compression_total"] for f in rows)
        out[key] = images / forwards
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="bench --json files of one regime")
    ap.add_argument("--reference", default="preset=paper", help="the parameter (key=value) that marks each "
                    "backend's reference row")
    args = ap.parse_args(argv)
    runs = [json.load(open(path)) for path in args.runs]
    values = pooled(runs)
    ref_item = tuple(args.reference.split("=", 1))
    ref_item = (ref_item[0], ref_item[1].lower())
    for key in sorted(values, key=lambda k: (k[0], sorted(k[1]))):
        backend, params = key
        # the reference: the backend's row marked by --reference that shares most parameters with this one
        refs = [k for k in values if k[0] == backend and ref_item in k[1]]
        ref = max(refs, key=lambda k: (len(k[1] & params), -len(k[1])), default=None)
        ratio = f"{values[key] / values[ref]:.3f}x the reference" if ref else "no reference row"
        label = backend + ":" + ",".join(f"{k}={v}" for k, v in sorted(params))
        print(f"{label:60s} {values[key]:6.3f} tokens per forward, {ratio}")


if __name__ == "__main__":
    main()
