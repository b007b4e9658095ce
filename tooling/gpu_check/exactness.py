"""gpu-check's exactness stage: chi-square against exact enumeration on tiny models on the device, one case per
lossless backend of the CPU suite (tests/test_exactness.py), and one planted bug the same test must catch."""
from __future__ import annotations

import time

import torch

from .records import error_text

# (backend, params, model, setting): cases of the CPU suite, in each backend's own rejection sampling
# (reproducible=False: the rule the planted bug breaks), then one case of the default "same image as AR" mode
# (verification by agreement with the position-keyed noise)
CURATED_CASES = [
    ("ar", {}, "v3-2x3-rowend", "cfg"),
    ("scd", dict(window=16, init="sample_above", coupling="gumbel"), "v4-2x2", "mixed"),
    ("sjd_pac", dict(window=16, tree_depth=3, tree_width=3), "v3-2x3-rowend", "topk"),
    ("hawk", dict(vertical_depth=1, candidates=2, node_budget=12), "v3-2x2", "cfg"),
    ("adt_tree", {}, "v3-2x3-rowend", "mixed"),
    ("sjd_pac", dict(window=16, tree_depth=3, tree_width=3, reproducible=True), "v3-2x3-rowend", "topk"),
]
# the model and setting of a registered lossless backend without a curated case: its defaults run there (the
# model with the most codes: a default tree as wide as 4 fits its vocabulary)
DEFAULT_CASE = ("v4-2x2", "mixed")
# the same test must catch a planted bug at the same sample count (tests/test_exactness.py's wrong residual)
PLANTED_CASE = ("sjd", dict(window=3, init="repeat_left"), "v3-2x2", "plain")
# a correct sampler fails the stage with probability below this (each case at this / the number of cases)
STAGE_P_FAIL = 1e-4


def exactness_cases() -> list:
    """The curated cases, then every other registered lossless backend at its defaults (samplers.backends)."""
    from ...samplers.backends import SCHEMAS
    covered = {case[0] for case in CURATED_CASES}
    return CURATED_CASES + [(m.name, {}, *DEFAULT_CASE) for m in SCHEMAS.values()
                            if m.lossless and m.name not in covered]


def _chi_square_case(device, backend, params, model_name, setting, n, seed, models) -> dict:
    from ...samplers.api import generate
    from ...model_loaders.tiny import tiny_model
    from ...tests.support.calls import generate_kwargs
    from ...tests.support.exactness import EXACTNESS_MODELS, EXACTNESS_SETTINGS, chi_square_test, exact_distribution
    if model_name not in models:
        models[model_name] = tiny_model(**EXACTNESS_MODELS[model_name], device=str(device))
    mdl = models[model_name]
    kw = EXACTNESS_SETTINGS[setting]
    t = time.perf_counter()
    params = {"reproducible": False, **params}  # a case says when it is the agreement mode
    res = generate(mdl, "hi", **generate_kwargs(backend=backend, **kw, **params), seed=seed, batch_size=n)
    p_value, stat, dof, tv = chi_square_test(res.tokens, exact_distribution(mdl, "hi", **kw))
    return {"backend": backend, "params": params, "model": model_name, "setting": setting, "samples": n,
            "p_value": p_value, "chi2": stat, "dof": dof, "total_variation": tv,
            "step_compression": res.stats.step_compression, "seconds": round(time.perf_counter() - t, 2)}


def stage_exactness(ctx) -> None:
    from ...samplers.verification import rejection as verify_mod
    dev = torch.device(ctx.options["device"])
    n, seed = ctx.options["samples"], 1234
    r = ctx.result
    cases = exactness_cases()
    p_fail = STAGE_P_FAIL / len(cases)
    r.update({"samples": n, "p_fail": p_fail, "device": str(dev), "dtype": "float32", "cases": []})
    models: dict = {}
    for backend, params, m, s in cases:
        if ctx.time_left() < 5:
            r["cases"].append({"backend": backend, "skipped": "stage budget spent"})
            continue
        try:
            case = _chi_square_case(dev, backend, params, m, s, n, seed, models)
            case["passed"] = case["p_value"] > p_fail
        except Exception as e:  # noqa: BLE001 -- one backend's failure must not hide the others'
            case = {"backend": backend, "params": {"reproducible": False, **params}, "model": m, "setting": s,
                    "error": error_text(e), "passed": False}
        r["cases"].append(case)
        ctx.track_memory()
        ctx.save()
    backend, params, m, s = PLANTED_CASE
    if ctx.time_left() > 5:
        real = verify_mod.residual
        verify_mod.residual = lambda p, q: p  # planted bug: resample from p instead of norm(max(0, p - q))
        try:
            case = _chi_square_case(dev, backend, params, m, s, n, seed, models)
            case["caught"] = case["p_value"] < p_fail
        except Exception as e:  # noqa: BLE001
            case = {"backend": backend, "error": error_text(e), "caught": False}
        finally:
            verify_mod.residual = real
        r["planted_wrong_residual"] = case
    ran = [c for c in r["cases"] if "skipped" not in c]
    r["all_passed"] = bool(ran) and len(ran) == len(cases) and all(c["passed"] for c in ran)
    ctx.track_memory()


__all__ = ["CURATED_CASES", "PLANTED_CASE", "STAGE_P_FAIL", "exactness_cases", "stage_exactness"]
