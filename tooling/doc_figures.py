"""Figures in README.md and docs/*.md rendered from committed JSON, so a doc cannot drift from its measurement.

A doc marks a block with the renderer and its JSON file:

    <!-- figures: bench docs/figures/current/bench_demo.json -->
    ...                         (rendered; never edited by hand)
    <!-- end figures -->

`python tooling/doc_figures.py` rewrites every block in place; `python tooling/doc_figures.py --check` exits 1
naming each block whose text differs from what its JSON renders (tooling/tests/test_doc_figures.py runs the check).
Renderers: `bench` (a `python -m specar bench --json` file: one row per configuration), `bench-counts` (the same
without the timing columns: forward counts do not depend on the machine), `demo` (a `python -m specar demo`
run's demo.json: one sentence), `vram` (`python -m specar.tooling memory --json`), `same-image` (tooling/half_same_image.py --json), `same-image-modes` (the same with several --invariant modes),
`forward-costs` (tooling/pinned_forward_cost.py --json), `source` (the command,
machine and date of any of those files).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- figures: (\S+) (\S+) -->\n)(.*?)(<!-- end figures -->)", re.S)


def _x(v, digits=2) -> str:
    return "-" if v is None else f"{v:.{digits}f}x"


def _source(d: dict) -> str:
    meta = d.get("meta", d)
    load = meta.get("load_average")
    load = f", load average {load[0]:.1f} at the start" if isinstance(load, list) and load else ""
    wall = f", wall {meta['wall_s']:.0f} s" if meta.get("wall_s") is not None else ""
    return (f"`{meta['command']}` on {meta.get('processor', 'an unnamed CPU')} ({meta.get('cpu_count', '?')} cores, "
            f"torch {meta.get('torch', '?')}, {meta.get('threads', '?')} threads{load}), {meta['date']}{wall}.")


def _bench(d: dict, timing: bool = True) -> str:
    head = ["configuration", "forwards", "step compression", "tokens / forward (total)"]
    if timing:
        head += ["latency (median)", "speed-up vs AR", "outside forward"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in d["rows"]:
        cells = [r["label"] + (" (LOSSY)" if r.get("lossy") else ""), f"{r['nfe']:.1f}", _x(r["step_compression"]),
                 _x(r["step_compression_total"])]
        if timing:
            share = r.get("overhead_share")
            cells += [f"{r['latency_median_s']:.3f} s", _x(r["speedup_vs_ar"]),
                      "-" if share is None else f"{100 * share:.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _source(d)


def _demo(d: dict) -> str:
    runs = d["runs"]
    backends = sorted({r["backend"] for r in runs if r["backend"] != "ar"})
    nfe = [r["nfe"] for r in runs if r["backend"] != "ar"]
    ar = [r["nfe"] for r in runs if r["backend"] == "ar"]
    return (f"{', '.join(backends)} needed {min(nfe)}-{max(nfe)} forward passes per image where AR needs "
            f"{max(ar)}, ran **{d['speedup_vs_ar']:.2f}x** AR's speed, and gave AR's image for "
            f"{d['images_equal_to_ar']} of {len(ar)} prompts: " + _source(d))


def _vram(d: dict) -> str:
    meta = d["meta"]
    small, wide, cards = meta["default_window"], meta["wide_window"], meta["cards_gib"]
    gb = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = [f"| model (released checkpoint) | parameters | weights bf16 / int8 / int4 | image tokens | KV cache at "
             f"window {small} / {wide} | fits on {' / '.join(map(str, cards))} GiB |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in d["rows"]:
        kv = " / ".join(f"{r['kv_gib'][str(w)]:.2f}" for w in (small, wide)) + " GiB" if r["kv_gib"] else "-"
        fits = " / ".join(r["fits"][str(c)] or "-" for c in cards)
        tokens = f"{r['image_tokens']} ({r['image_px']} px)" if r["image_tokens"] else f"({r['image_px']} px)"
        lines.append(f"| {r['model']} ({r['checkpoint'].split(' ')[0]}) | {r['parameters'] / 1e9:.2f} B | "
                     f"{gb(r['bf16_gib'])} / {gb(r['int8_gib'])} / {gb(r['int4_gib'])} GiB | {tokens} | {kv} | {fits} |")
    return "\n".join(lines) + (
        f"\n\nComputed from the published configurations, not measured, in GiB (2^30 bytes, as cards are sold): weights of the "
        f"decoder (GLM-Image: each stage, then the whole image, both stages held at once); KV cache in bf16 of one "
        f"image (with CFG: 2 rows) with `auto`'s draft slots at max_window {small} (its default) and {wide}; fits: the "
        f"most precise weights (bf16, else int8, else int4) for which weights + KV at window {wide} + {meta['allowance_gib']} GiB (assumed for "
        f"activations, the image tokenizer and CUDA) fit the card, `-` where none does. `{meta['command']}`, "
        f"{meta['date']}.")


def _same_image(d: dict) -> str:
    rows, seeds = d["rows"], sorted({r["seed"] for r in d["rows"]})
    guarantee = {r["guarantee"] for r in rows}
    lines = [f"| dtype | backend | images differing from AR's | tokens differing (seeds {', '.join(map(str, seeds))}) |",
             "| --- | --- | ---: | --- |"]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for backend in dict.fromkeys(r["backend"] for r in rows):
            mine = [r for r in rows if r["dtype"] == dtype and r["backend"] == backend]
            lines.append(f"| {dtype} | {backend} | {sum(r['differing_tokens'] > 0 for r in mine)} of {len(mine)} | "
                         f"{', '.join(str(r['differing_tokens']) for r in mine)} |")
    return "\n".join(lines) + f"\n\nTarget forwards: {', '.join(sorted(map(str, guarantee)))}. " + _source(d)


MODE_NAMES = {"default": "float64 batch-invariant (the CPU's default)", "pinned": "shape-pinned alone",
              "off": "plain bf16"}


def _same_image_modes(d: dict) -> str:
    """tooling/half_same_image.py with several --invariant modes: per backend and mode, the images and tokens that
    differ from AR's (AR in the same mode; pinned: padded to the backend's width) and the median seconds of both."""
    import statistics
    rows = d["rows"]
    lines = ["| backend | target forwards | images differing from AR's | tokens differing (per image) | s, backend "
             "(median) | s, its AR (median) |", "| --- | --- | ---: | --- | ---: | ---: |"]
    for backend in dict.fromkeys(r["backend"] for r in rows):
        for mode in dict.fromkeys(r["invariant"] for r in rows):
            mine = [r for r in rows if r["backend"] == backend and r["invariant"] == mode]
            if not mine:
                continue
            width = f" at {mine[0]['pin_width']} tokens" if mine[0].get("pin_width") else ""
            lines.append(f"| {backend} | {MODE_NAMES.get(mode, mode)}{width} | "
                         f"{sum(r['differing_tokens'] > 0 for r in mine)} of {len(mine)} | "
                         f"{', '.join(str(r['differing_tokens']) for r in mine)} | "
                         f"{statistics.median(r['seconds'] for r in mine):.1f} | "
                         f"{statistics.median(r['ar_seconds'] for r in mine):.1f} |")
    cut = "" if d["meta"].get("complete", True) else " The run was cut short: the rows above are what it finished."
    return "\n".join(lines) + "\n\n" + _source(d) + cut


def _forward_costs(d: dict) -> str:
    """tooling/pinned_forward_cost.py: the fastest forward per width, plain and float64 batch-invariant."""
    lines = ["| tokens per forward | plain bf16, ms of CPU time | float64 batch-invariant, ms of CPU time | float64 / plain |",
             "| ---: | ---: | ---: | ---: |"]
    for r in d["rows"]:
        lines.append(f"| {r['width']} | {r['plain_ms']:.2f} | {r['float64_ms']:.2f} | "
                     f"{r['float64_ms'] / r['plain_ms']:.2f}x |")
    return "\n".join(lines) + "\n\n" + _source(d)


RENDERERS = {"same-image-modes": _same_image_modes, "forward-costs": _forward_costs, "bench": _bench, "bench-counts": lambda d: _bench(d, timing=False), "demo": _demo, "vram": _vram, "same-image": _same_image,
             "source": _source}


def render(kind: str, path: str) -> str:
    if kind not in RENDERERS:
        raise ValueError(f"unknown figures renderer {kind!r}; known: {', '.join(RENDERERS)}")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return RENDERERS[kind](json.load(f)).rstrip("\n") + "\n"


def docs() -> list:
    return ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                                  if f.endswith(".md"))


def stale_blocks(doc: str, fix: bool = False) -> list:
    """The blocks of `doc` whose text is not what their JSON renders (rewritten when `fix`)."""
    full = os.path.join(ROOT, doc)
    text = open(full, encoding="utf-8").read()
    stale = []

    def sub(m):
        if not os.path.exists(os.path.join(ROOT, m.group(3))):
            stale.append(f"{doc}: the `{m.group(2)} {m.group(3)}` block's JSON does not exist")
            return m.group(0)
        fresh = render(m.group(2), m.group(3))
        if m.group(4) != fresh:
            stale.append(f"{doc}: the `{m.group(2)} {m.group(3)}` block differs from what its JSON renders")
        return m.group(1) + fresh + m.group(5)

    new = BLOCK.sub(sub, text)
    if fix and new != text:
        with open(full, "w", encoding="utf-8") as f:
            f.write(new)
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Rewrite (or --check) every generated figure block in README.md "
                                                 "and docs/*.md from its committed JSON.")
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 naming each stale block")
    check = parser.parse_args(argv).check
    stale = [s for doc in docs() for s in stale_blocks(doc, fix=not check)]
    for s in stale:
        print(s)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
