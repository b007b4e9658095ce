"""gpu-check's plan: what each stage runs, in which order, and its predicted seconds against its budget, from the
stage times of the GPU reports committed in docs/figures/gpu_*/gpu_check.json (`--plan-only` prints it; the
report keeps it beside the measured times).

The backends come from the registry (samplers.backends.SCHEMAS), in this order: AR first (every ratio's base),
then the backends that no committed report has compiled, then the others, so that a short lease measures what no
GPU has run first. A backend registered in METHODS is in the plan with no other change. A committed report's
timings: the time a stage process takes to start (an exactness stage's seconds less its cases'), each item's
seconds (an eager or compiled generation, a chi-square case per sample, a 7B-shape forward per token count);
an item no report timed is predicted at the slowest of its kind, and marked so."""
from __future__ import annotations

import glob
import json
import os
import statistics

# the reports of GPU runs: docs/ lies beside the code in the repository root
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORTS_GLOB = os.path.join(REPO_ROOT, "docs", "figures", "gpu_*", "gpu_check.json")
RATIO_BASE = "ar"  # every latency ratio's base: the plain AR backend


def committed_reports(pattern: str = REPORTS_GLOB) -> list:
    """(path, report) of every committed GPU run (dry runs left out), by path."""
    out = []
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            continue
        if not report.get("meta", {}).get("dry_run"):
            out.append((path, report))
    return out


def _result(report: dict, stage: str) -> dict:
    return (report["stages"].get(stage) or {}).get("result") or {}


def compiled_on_a_gpu(reports: list) -> set:
    """The backends with a compiled generation measured in a committed report."""
    return {b for _, r in reports for b, row in _result(r, "backends").get("rows", {}).items()
            if (row.get("compiled") or {}).get("latency_s")}


def backend_order(reports: list) -> list:
    """Every registered backend: AR, those no committed report has compiled, then the others (registry order)."""
    from ...samplers.backends import SCHEMAS
    done = compiled_on_a_gpu(reports)
    rest = [b for b in SCHEMAS if b != RATIO_BASE]
    return [RATIO_BASE] + [b for b in rest if b not in done] + [b for b in rest if b in done]


class Timings:
    """What the committed reports measured, per item (the slowest where several did: a plan errs long)."""

    def __init__(self, reports: list):
        self.sources = [path for path, _ in reports]
        self.eager, self.compiled, self.compile_cut, self.case_rate = {}, {}, {}, {}
        self.fwd = {"eager": {}, "compiled": {}}
        self.first_generation, self.build, starts, env = [], [], [], []
        for _, r in reports:
            ex, st = _result(r, "exactness"), r["stages"]
            if st.get("exactness", {}).get("status") == "ok":
                cases = ex.get("cases", []) + [ex.get("planted_wrong_residual") or {}]
                starts.append(st["exactness"]["seconds"] - sum(c.get("seconds", 0) for c in cases))
                for c in cases:
                    if c.get("seconds") and c.get("samples"):
                        self._slowest(self.case_rate, c["backend"], c["seconds"] / c["samples"])
            if st.get("environment", {}).get("status") == "ok":
                env.append(st["environment"]["seconds"])
        self.start = statistics.median(starts) if starts else None
        self.environment = max(env) if env else None
        for _, r in reports:
            self._backends(r["stages"].get("backends") or {}, self.start or 0.0)
            f = _result(r, "forward_7b")
            if "build_s" in f:
                self.build.append(f["build_s"])
            for mode in ("eager", "compiled"):
                for T, v in f.get(mode, {}).items():
                    if isinstance(v, dict) and "forward_ms" in v:  # first call, then 2 + repeats timed ones
                        self._slowest(self.fwd[mode], int(T), (v["first_call_s"], v["forward_ms"] / 1e3))

    def _backends(self, stage: dict, start: float) -> None:
        """Each row's eager and compiled times; in a stage cut for time, the compile that was running (the first
        row without a compiled time: rows are in the stage's order) took at least what was left of the stage."""
        b = stage.get("result") or {}
        if "first_generation_s" not in b:
            return
        spent = start + b["first_generation_s"] + b.get("load_s", 0.0)
        self.first_generation.append(b["first_generation_s"] + b.get("load_s", 0.0))
        running = None
        for name, row in b.get("rows", {}).items():
            e, c = row.get("eager") or {}, row.get("compiled") or {}
            if e.get("wall_s"):
                self._slowest(self.eager, name, e["wall_s"])
                spent += e["wall_s"]
            if c.get("wall_s") and c.get("first_run_s"):
                self._slowest(self.compiled, name, c["first_run_s"] + c["wall_s"])
                spent += c["first_run_s"] + c["wall_s"]
            elif running is None and not c.get("error"):
                running = name
        if stage.get("status") == "timed out" and running is not None:
            self._slowest(self.compile_cut, running, stage["seconds"] - spent)

    @staticmethod
    def _slowest(table: dict, key, value) -> None:
        table[key] = max(table[key], value) if key in table else value

    def item(self, table: dict, key):
        """(seconds, estimated): the item's own time, else the slowest of its kind, or more for a compile cut
        while it ran (None: nothing measured)."""
        if key in table:
            return table[key], False
        slowest = max(table.values()) if table else None
        if table is self.compiled and key in self.compile_cut:
            slowest = max(slowest or 0.0, self.compile_cut[key])
        return slowest, True


def _stage(budget: float, fixed: list, items: list) -> dict:
    """A stage's plan: its fixed costs, its items in order, the predicted seconds and the items past the budget."""
    known = [s for _, s, _ in fixed + items if s is not None]
    out = {"budget_s": budget, "items": [{"item": n, "predicted_s": None if s is None else round(s, 1),
                                          **({"estimated": est} if est else {})} for n, s, est in fixed + items]}
    out["predicted_s"] = round(sum(known), 1) if known and len(known) == len(fixed + items) else None
    spent, cut = 0.0, []
    for n, s, _ in fixed + items:
        spent += s or 0.0
        if spent > budget:
            cut.append(n)
    out["cut"] = cut
    return out


def plan(options: dict, reports: list) -> dict:
    """Each selected stage's items with their predicted seconds (None in a dry run: the committed times are a
    GPU's) against its budget."""
    from .exactness import PLANTED_CASE, exactness_cases
    t = Timings(reports)
    gpu = not options["dry_run"]
    at = (lambda table, key: t.item(table, key)) if gpu else (lambda table, key: (None, False))  # noqa: E731
    start = [("process start", t.start if gpu else None, False)]
    stages = {}
    for name in options["stages"]:
        budget = options["budgets"][name]
        if name == "environment":
            stages[name] = _stage(budget, [("versions, SDPA kernels, compile smoke test, CUDA-graph probe, peaks",
                                            t.environment if gpu else None, False)], [])
        elif name == "exactness":
            items = []
            for backend, params, model, setting in exactness_cases() + [PLANTED_CASE]:
                rate, est = at(t.case_rate, backend)
                label = f"chi-square {backend} {json.dumps(params)} on {model}, {setting}"
                items.append((label, None if rate is None else rate * options["samples"], est))
            stages[name] = _stage(budget, start, items)
        elif name == "backends":
            first = max(t.first_generation) if gpu and t.first_generation else None
            fixed = start + [("load the model, first generation", first, False)]
            items = [(f"eager {b}", *at(t.eager, b)) for b in options["backends"]]
            items += [(f"compiled {b}", *at(t.compiled, b))
                      for b in (options["compile_backends"] if options["compile"] else [])]
            stages[name] = _stage(budget, fixed, items)
        elif name == "forward_7b":
            build = max(t.build) if gpu and t.build else None
            def forward(mode, T):  # its first call, then 2 + repeats more
                got, est = at(t.fwd[mode], T)
                return (None if got is None else got[0] + (2 + options["repeats_7b"]) * got[1]), est

            eager = [forward("eager", T) for T in options["tokens_7b"]]
            items = [(f"eager forwards of {len(eager)} token counts", None if any(s is None for s, _ in eager) else
                      sum(s for s, _ in eager), any(est for _, est in eager))]
            items += [(f"compiled forward, {T} tokens", *forward("compiled", T))
                      for T in (options["compiled_tokens_7b"] if options["compile"] else [])]
            stages[name] = _stage(budget, start + [("build the 7B shape", build, False)], items)
        elif name == "images":
            stages[name] = _stage(budget, start, _images_items(options, t, gpu))
        elif name == "quantized":
            stages[name] = _stage(budget, start, _quantized_items(options, t, gpu))
        elif name == "projection":
            stages[name] = _stage(budget, start, [("measured step costs x committed regime step counts (no device "
                                                   "work)", 0.5 if gpu else None, False)])
    known = [s["predicted_s"] for s in stages.values()]
    return {"sources": t.sources, "backend_order": options["backends"], "total_budget_s": options["total_budget"],
            "predicted_total_s": round(sum(known), 1) if known and None not in known else None, "stages": stages,
            "follow_up": _follow_up(options, t, gpu, start) if "images" in stages else {}}


def _follow_up(options: dict, t: Timings, gpu: bool, start: list) -> dict:
    """The released models this run leaves out (Emu3.5-Image, 34 B, past the images stage's budget): the images stage
    a lease of their own runs (`--image-families NAME`: every backend over the profile's rows of that model)."""
    from . import PROFILES
    from ..released_models import RELEASED
    rows = PROFILES["cuda" if gpu else "dry"]["image_rows"]
    return {f: _stage(options["budgets"]["images"], start, _images_items(
        {**options, "image_families": [f], "image_family_backends": {}, "image_rows": {f: rows.get(f)}}, t, gpu))
        for f in RELEASED if f not in options["image_families"]}


# the images stage's costs no committed report measured (estimates, marked so): building a 7B model with random
# weights on the device and its loader's files; a forced batch-invariant (float64) step against a bf16 one; our
# weight-only int8 / int4 forward against bf16 (a bf16 copy of each weight per forward)
BUILD_7B_S, INVARIANT_STEP_FACTOR, OURS_QUANT_FACTOR = 15.0, 4.0, 3.0
# a family's step and build against the 7B shape's: its decoder's weights over the 7B shape's (GLM-Image's AR stage:
# 9.29 B of its decoder, tooling/memory.py's count, over Lumina-mGPT-7B's 6.7 B)
STEP_SCALE = {"glm-image": 9.29 / 6.7, "emu3.5-image": 31.2 / 6.7}  # Emu3.5: its 31.2 B converted decoder weights
SAVED_7B_S = 180.0  # `--image-weights saved`: 7B weights built on the CPU, written (15 GB) and read back
ESTIMATE = "from the 7B shape's forwards and the demo model's steps (plan.py)"


def _step_costs(t: Timings, backend: str):
    """(eager, compiled) seconds per step of a 7B-shape generation with `backend`, and its compile seconds: the 7B
    shape's measured 1-token forward plus what the backend's demo step costs besides its forward (its whole eager or
    compiled step, per forward, on the demo model); None where nothing was measured."""
    fwd_e, fwd_c = t.fwd["eager"].get(1), t.fwd["compiled"].get(1)
    demo_e, _ = t.item(t.eager, backend)
    demo_c, _ = t.item(t.compiled, backend)
    eager = fwd_e[1] + (demo_e or 0.0) / 255 if fwd_e else None  # the demo image: 255 steps of AR
    compiled = fwd_c[1] + 1e-3 if fwd_c else None
    compile_s = max(v[0] for v in t.fwd["compiled"].values()) + (demo_c or 0.0) if t.fwd["compiled"] else None
    return eager, compiled, compile_s


def _positions(options: dict, family: str, rows="asked") -> int:
    from ..released_models import RELEASED
    n = RELEASED[family].positions(options["image_rows"].get(family) if rows == "asked" else rows)
    cap = options.get("image_positions_cap")
    return n if cap is None else min(n, cap)


def _what(fam: str, n: int) -> str:
    """'N positions', with GLM-Image's size and grids (its positions are the preview grid's, then the image's)."""
    from ..released_models import RELEASED
    r = RELEASED[fam]
    if not r.preview_grid:
        return f"{n} positions"
    side = r.spec.dims["image"]
    return f"{side}x{side}, {n} of {r.positions()} positions (preview grid first)"


def _images_items(options: dict, t: Timings, gpu: bool) -> list:
    """Per family: build, then each backend eager, the batch-invariant flips, the pinned runs, the compiled runs; every
    step count
    the upper bound of one position per step (random weights accept few drafts), so every item is an estimate."""
    items = []
    for fam in options["image_families"]:
        limited = options["image_family_backends"].get(fam)  # AR and the default backend eager only
        scale = STEP_SCALE.get(fam, 1.0)
        n = _positions(options, fam)
        n_inv = _positions(options, fam, options["image_invariant_rows"])
        saved = options["image_weights"] == "saved"
        share = "" if limited is None else (f" (this run's share: {' and '.join(limited)} eager; --image-families "
                                            f"{fam} runs every backend)")
        weights = "random weights written and read back" if saved else "random weights on the device"
        items.append((f"{fam}{share}: build ({weights}"
                      f", the loader's files), first generation",
                      scale * (SAVED_7B_S if saved else BUILD_7B_S) if gpu else None, ESTIMATE))
        for b in limited if limited is not None else options["image_backends"]:
            e, _, _ = _step_costs(t, b) if gpu else (None, None, None)
            items.append((f"{fam}: eager {b}, {_what(fam, n)}", None if e is None else scale * n * e, ESTIMATE))
            if limited is None and b in options["image_invariant_backends"]:
                items.append((f"{fam}: eager {b} batch-invariant flipped, {n_inv} positions",
                              None if e is None else n_inv * e * INVARIANT_STEP_FACTOR, ESTIMATE))
        fwd = t.fwd["eager"]  # a pinned step: at most the widest measured 7B-shape forward instead of a 1-token one
        widest = fwd[max(fwd)][1] - fwd[1][1] if gpu and 1 in fwd else 0.0
        if limited is not None:
            continue
        for b in options["image_pinned_backends"] if fam in options["image_pinned_families"] else []:
            e, _, _ = _step_costs(t, b) if gpu else (None, None, None)
            items.append((f"{fam}: eager {b} shape-pinned at its verify width and AR padded to it, {n_inv} positions",
                          None if e is None else 2 * n_inv * (e + widest), ESTIMATE))
        for b in options["image_compile_backends"] if options["compile"] else []:
            _, c, comp = _step_costs(t, b) if gpu else (None, None, None)
            items.append((f"{fam}: compiled {b} (compile, then timed), {n} positions",
                          None if c is None else comp + 2 * n * c, ESTIMATE))
    return items


def _quantized_items(options: dict, t: Timings, gpu: bool) -> list:
    from .quantized import EXACTNESS_ROWS, variants
    fwd = {T: v[1] for T, v in t.fwd["eager"].items()}
    items = []
    for name, _ in variants(gpu, installed_only=False):
        factor = OURS_QUANT_FACTOR if name.startswith("ours") else 1.0
        forwards = sum((1 + options["repeats_quant"]) * fwd.get(-(-rows // 2), max(fwd.values(), default=0))
                       for rows in options["quant_rows"]) if fwd else None  # at most a CFG forward's cost
        exact = 2 * 2 * EXACTNESS_ROWS * 49 * fwd[1] if 1 in fwd else None  # plain and pinned; 48 codes + a row end
        items.append((f"{name}: build, forwards of {options['quant_rows']} rows, exactness case plain and pinned"
                      + ("" if name.startswith(("bf16", "ours")) else " (where installed)"),
                      None if not gpu or forwards is None or exact is None else
                      3.0 + factor * (forwards + exact), ESTIMATE))
    return items


def plan_text(p: dict, verbose: bool = True) -> str:
    """The plan as text: per stage its budget, prediction and items (those predicted past the budget marked)."""
    src = ", ".join(os.path.relpath(s, REPO_ROOT) for s in p["sources"]) or "none (no committed GPU report)"
    fmt = lambda s: "-" if s is None else f"{s:.0f}" if s >= 10 else f"{s:.1f}"  # noqa: E731
    lines = [f"gpu-check plan: predictions from {src}", f"backends, in order: {' '.join(p['backend_order'])}", "",
             f"{'stage':12s} {'budget s':>8s} {'predicted s':>11s}"]
    for name, s in p["stages"].items():
        lines.append(f"{name:12s} {fmt(s['budget_s']):>8s} {fmt(s['predicted_s']):>11s}"
                     + (f"  PREDICTED PAST ITS BUDGET: {len(s['cut'])} item(s) cut" if s["cut"] else ""))
        for it in s["items"] if verbose else []:
            mark = " (cut)" if it["item"] in s["cut"] else ""
            est = it.get("estimated")
            est = f" (estimated: {est if isinstance(est, str) else 'the slowest of its kind'})" if est else ""
            lines.append(f"    {fmt(it['predicted_s']):>6s} s  {it['item']}{mark}{est}")
    lines.append(f"{'total':12s} {fmt(p['total_budget_s']):>8s} {fmt(p['predicted_total_s']):>11s}")
    for fam, s in p.get("follow_up", {}).items():
        past = f", {len(s['cut'])} past the budget" if s["cut"] else ""
        lines.append(f"not in this run, its own lease: --image-families {fam}: images stage {fmt(s['predicted_s'])} s "
                     f"predicted ({len(s['items'])} items{past})")
        for it in s["items"] if verbose else []:
            lines.append(f"    {fmt(it['predicted_s']):>6s} s  {it['item']}")
    return "\n".join(lines)


__all__ = ["RATIO_BASE", "backend_order", "committed_reports", "compiled_on_a_gpu", "plan", "plan_text"]
