"""The roofline projection (tooling/roofline.py) re-fitted to the forward latencies that gpu-check measures on a
GPU (its forward_7b stage). Uses roofline.py's API only (its kernels, device time, plans and published fit);
pure Python, no torch.
"""
from __future__ import annotations

import json
from dataclasses import replace

from .. import roofline as rl

BANDWIDTH_EFFS = [round(0.30 + 0.05 * i, 2) for i in range(15)]  # 0.30 .. 1.00
FLOPS_EFFS = [round(0.20 + 0.05 * i, 2) for i in range(17)]  # 0.20 .. 1.00


def card_of(name: str, peaks: dict):
    """The roofline's datasheet GPU for this device name, else one from this device's measured
    peaks (copy bandwidth, matrix product rate)."""
    n = name.upper()
    key = None
    if "H100" in n and "PCIE" not in n:
        key = "h100"
    elif "A100" in n and "80GB" in n and "PCIE" not in n:
        key = "a100"
    elif "4090" in n:
        key = "rtx4090"
    if key:
        return rl.GPUS[key], "datasheet"
    if not peaks or "copy_bytes_per_s" not in peaks:
        raise ValueError(f"no datasheet for {name!r} and no measured peaks (the environment stage did not run)")
    return rl.GPU(name, peaks["copy_bytes_per_s"], peaks["matmul_flops_per_s"],
                  "measured by gpu-check's environment stage (device copy, matrix product)"), "measured"


def _fit_scale(a, b, m) -> float:
    """x minimising sum(((a_i + b_i x) / m_i - 1)^2): relative least squares, closed form."""
    num = sum((bi / mi) * (1 - ai / mi) for ai, bi, mi in zip(a, b, m))
    den = sum((bi / mi) ** 2 for bi, mi in zip(b, m))
    return num / den if den > 0 else 0.0


def _rel_errors(pred, m):
    return [p / x - 1 for p, x in zip(pred, m)]


def refit_roofline(measured: dict, env: dict, bench_json: str, dry_run: bool = False) -> dict:
    """The roofline's free constants re-fitted to the measured forwards of the 7B shape:
    - efficiencies (bandwidth, tensor FLOPs): grid search on the compiled forwards, taken as
      graph-captured (no host cost per kernel); the defaults when none was measured;
    - launch_s, the host's cost per launched op: least squares on the eager forwards, with the
      eager launches counted on this model (TorchDispatchMode), given those efficiencies.
    Then the per-backend projection of `bench_json` on this card: the paper-fitted constants
    (the documented projection), eager with the refit, and graph-captured with the refit."""
    shape = replace(rl.LUMINA_MGPT_7B, name="SpecAR LlamaDecoder, 7B shape", qk_norm=False,
                    head_rows_read=measured["shape"]["image_codes"], hidden=measured["shape"]["hidden_size"],
                    layers=measured["shape"]["num_layers"], mlp=measured["shape"]["intermediate_size"],
                    vocab=measured["shape"]["vocab_size"],
                    bytes_per_param=2 if measured["dtype"] in ("bfloat16", "float16") else 4)
    device_name = env.get("device_name") or measured["device"]
    gpu, gpu_source = card_of(device_name, env.get("peaks", {}))
    S = measured["kv_slots"]
    # a compiled row that fell back to eager (the compiler failed) is not a compiled forward
    ok = lambda d: {int(T): v["forward_ms"] / 1e3 for T, v in d.items()  # noqa: E731
                    if isinstance(v, dict) and "forward_ms" in v and not v.get("eager_fallback")}
    eager, compiled = ok(measured["eager"]), ok(measured["compiled"])
    if not eager and not compiled:
        raise ValueError("no forward was measured: nothing to fit")
    kernels = {T: rl.forward_kernels(shape, T, 2, S - T) for T in set(eager) | set(compiled)}
    out = {"card": gpu.name, "card_source": gpu_source, "bandwidth": gpu.bandwidth, "bf16_flops": gpu.bf16_flops,
           "kv_slots": S, "model_shape": shape.name, "dry_run": dry_run}
    eff = rl.EFFICIENCY
    if compiled:
        Ts = sorted(compiled)
        grid = []
        for bw in BANDWIDTH_EFFS:
            for fl in FLOPS_EFFS:
                e = rl.Efficiency(bw, fl)
                err = sum(x * x for x in _rel_errors([rl.device_seconds(kernels[T], gpu, e) for T in Ts],
                                                     [compiled[T] for T in Ts]))
                grid.append((err, e))
        least = min(err for err, _ in grid)
        # every setting as good as the best: a constant that does not change the fit is not measured by it
        # (all forwards memory-bound: the FLOPs efficiency); among those, the one nearest the assumed defaults
        ties = [e for err, e in grid if err <= least * (1 + 1e-9) + 1e-18]
        d = rl.EFFICIENCY
        eff = min(ties, key=lambda e: (abs(e.bandwidth_eff - d.bandwidth_eff), abs(e.flops_eff - d.flops_eff)))
        pred = [rl.device_seconds(kernels[T], gpu, eff) for T in Ts]
        out["compiled_fit"] = {"bandwidth_eff": eff.bandwidth_eff, "flops_eff": eff.flops_eff,
                               "bandwidth_eff_identified": len({e.bandwidth_eff for e in ties}) == 1,
                               "flops_eff_identified": len({e.flops_eff for e in ties}) == 1,
                               "max_abs_rel_error": max(abs(x) for x in _rel_errors(pred, [compiled[T] for T in Ts])),
                               "grid_edge": eff.bandwidth_eff in (BANDWIDTH_EFFS[0], BANDWIDTH_EFFS[-1]) or
                               eff.flops_eff in (FLOPS_EFFS[0], FLOPS_EFFS[-1]), "tokens": Ts}
    else:
        out["compiled_fit"] = {"bandwidth_eff": eff.bandwidth_eff, "flops_eff": eff.flops_eff,
                               "note": "no compiled forward measured: the roofline's assumed efficiencies"}
    launches = measured.get("launches") or {}
    if len(launches) == 2:  # counted at two token counts: linear in between (one op list per forward)
        (lo, n_lo), (hi, n_hi) = sorted((int(k), v) for k, v in launches.items())
        per_T = lambda T: n_lo + (n_hi - n_lo) * (T - lo) / max(hi - lo, 1)  # noqa: E731
    else:
        per_T = lambda T: rl.forward_launches(shape, T, 2, S - T)  # noqa: E731
    launch_s = None
    if eager:
        Ts = sorted(eager)
        a = [rl.device_seconds(kernels[T], gpu, eff) for T in Ts]
        b = [per_T(T) for T in Ts]
        launch_s = _fit_scale(a, b, [eager[T] for T in Ts])
        errors = _rel_errors([ai + bi * launch_s for ai, bi in zip(a, b)], [eager[T] for T in Ts])
        out["eager_fit"] = {"launch_s": launch_s, "launches_per_forward_t1": per_T(1),
                            "launch_count_source": "counted on this model" if len(launches) == 2 else "roofline model",
                            "max_abs_rel_error": max(abs(x) for x in errors)}
    out["forwards"] = []
    for T in sorted(set(eager) | set(compiled)):
        device_s = rl.device_seconds(kernels[T], gpu, eff)
        out["forwards"].append({"tokens": T, "eager_ms": 1e3 * eager[T] if T in eager else None,
                                "compiled_ms": 1e3 * compiled[T] if T in compiled else None,
                                "roofline_ms": 1e3 * device_s,
                                "eager_model_ms": None if launch_s is None else 1e3 * (device_s + per_T(T) * launch_s)})
    try:
        with open(bench_json) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError) as e:
        out["projection"] = {"error": f"cannot read --bench-json {bench_json!r}: {e}"}
        return out
    paper_launch = rl.fitted_launch_s()
    proj_shape = rl.LUMINA_MGPT_7B
    table = []
    variants = [("paper_fit", paper_launch, rl.EFFICIENCY), ("graph_captured_refit", 0.0, eff)]
    if launch_s is not None:
        variants.insert(1, ("eager_refit", launch_s, eff))
    for row in rows:
        try:
            plan = rl.backend_plan(row)
        except ValueError as e:
            table.append({"label": row.get("label", row.get("backend")), "error": str(e)})
            continue
        entry = {"label": row.get("label", row["backend"]), "backend": row["backend"],
                 "step_compression_total": row.get("step_compression_total"), "forwards": plan.forwards,
                 "tokens_per_forward": rl.mean_tokens(plan)}
        for name, ls, e in variants:
            s = rl.generation_seconds(proj_shape, gpu, plan, ls, eff=e)
            entry[name] = {"seconds": s}
        table.append(entry)
    ar = next((t for t in table if t.get("backend") == "ar" and "error" not in t), None)
    for t in table:
        for name, _, _ in variants:
            if ar and name in t:
                t[name]["speedup_vs_ar"] = ar[name]["seconds"] / t[name]["seconds"]
    out["projection"] = {"kind": "projection", "bench_json": bench_json, "shape": proj_shape.name,
                         "paper_launch_s": paper_launch, "variants": [v[0] for v in variants], "rows": table}
    return out


__all__ = ["card_of", "refit_roofline"]
