"""gpu-check's projection stage (no device work): the images stage's measured ms per step of each backend times the
number of steps a whole image takes in a committed regime run (`REGIMES`: image tokens / step compression per
backend), beside published anchors (`ANCHORS`). Every row is labelled "projection": random weights accept few
drafts, so the images stage measures step costs, and the committed CPU regime runs (trained weights or a regime
calibrated to a paper's acceptance) give the step counts."""
from __future__ import annotations

import json
import os

from .plan import REPO_ROOT

# regime -> (committed bench JSON, what its step counts are)
REGIMES = {
    "paper, same image": ("docs/figures/bench_regime_paper_same_image.json",
                          "the paper regime (the demo model calibrated to SJD's 2.22 tokens per forward on "
                          "Lumina-mGPT) in the users' default same-image mode"),
    "paper, own sampling": ("docs/figures/bench_regime_paper.json",
                            "the paper regime, each backend's own rejection sampling (as the papers ran)"),
}
ANCHORS = [
    {"what": "Emu3-8B eager decoding", "value": "about 37 ms per step", "device": "H100",
     "source": "published figure quoted in issue 50"},
    {"what": "SJD-PAC latency speedup over AR", "value": "3.97x", "device": "A100",
     "source": "the SJD-PAC paper, as quoted in issue 50"},
    {"what": "Lumina-mGPT 2.0 AR image (768 px)", "value": "694 s per image (324 s with their SJD)", "device": "A100",
     "source": "the authors' README (docs/MODELS.md)"},
    {"what": "GLM-Image AR stage at 1024x1024 (1,281 tokens)", "family": "glm-image",
     "value": "19.0 s (14.8 ms a token; CUDA graphs, no speculative decoding); about 26 s through transformers",
     "device": "H100", "source": "vLLM-Omni, as quoted in issue 54"},
]


def _label_params(label: str) -> set:
    params = set(label.split(":", 1)[1].split(",")) if ":" in label else set()
    return {p for p in params if p and not p.startswith("reproducible=")}


def regime_compressions(path: str, presets: dict) -> dict:
    """backend -> step compression of the regime run's row at the backend's defaults (its paper preset for those in
    `presets`); backends without such a row are left out."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    out = {}
    for row in rows:
        b = row["backend"]
        want = {f"preset={presets[b]}"} if b in presets else set()
        if b not in out and _label_params(row["label"]) == want and row.get("step_compression"):
            out[b] = row["step_compression"]
    return out


def project(images: dict, presets: dict, root: str = REPO_ROOT) -> list:
    """Rows (family, regime, backend, mode, ms per step measured, steps per whole image, seconds, x AR)."""
    out = []
    for regime, (rel, what) in REGIMES.items():
        try:
            comp = regime_compressions(os.path.join(root, rel), presets)
        except (OSError, ValueError, KeyError) as e:
            out.append({"kind": "projection", "regime": regime, "error": f"{rel}: {type(e).__name__}: {e}"})
            continue
        for fam_name, fam in (images.get("families") or {}).items():
            info = fam.get("model") or {}
            codes = info["grid"][0] * info["grid"][1] if info.get("grid") else None  # image codes per image
            if codes and info.get("preview_grid"):  # a two-grid model: its preview grid's codes too
                codes += info["preview_grid"][0] * info["preview_grid"][1]
            anchor = next((a for a in ANCHORS if a.get("family") == fam_name), None)
            for mode in ("eager", "compiled"):
                ar = None
                for b, row in (fam.get("rows") or {}).items():
                    ms = (row.get(mode) or {}).get("step_ms_median")
                    if not ms or b not in comp or not codes:
                        continue
                    steps = codes / comp[b]
                    rec = {"kind": "projection", "family": fam_name, "regime": regime, "regime_source": rel,
                           "regime_steps": what, "backend": b, "mode": mode, "measured_step_ms": ms,
                           "step_compression": comp[b], "steps_per_image": round(steps, 1),
                           "seconds_per_image": round(steps * ms / 1e3, 2)}
                    if anchor:  # the published figure the projection stands beside (not a measurement of ours)
                        rec["anchor"] = f"{anchor['what']}: {anchor['value']}, {anchor['device']} ({anchor['source']})"
                    ar = rec["seconds_per_image"] if b == images.get("ratio_base") else ar
                    out.append(rec)
                for rec in out:
                    if rec.get("family") == fam_name and rec.get("regime") == regime and rec.get("mode") == mode:
                        rec["speedup_vs_ar"] = ar / rec["seconds_per_image"] if ar else None
    return out


def stage_projection(ctx) -> None:
    images = (ctx.previous.get("images") or {}).get("result") or {}
    r = ctx.result
    r.update(kind="projection", anchors=ANCHORS, dry_run=ctx.options["dry_run"],
             note="step costs measured by the images stage (random weights) x step counts of committed CPU regime "
                  "runs: a projection, not a measured image time")
    r["rows"] = project(images, ctx.options["image_presets"]) if images else []
    if not images:
        r["missing"] = "no images stage result in this run (run --stages images projection)"


__all__ = ["ANCHORS", "REGIMES", "project", "regime_compressions", "stage_projection"]
