"""`python -m specar.tooling evaluate-demo`: how well the demo model follows prompts, judged automatically.

Generates the fixed prompts of model_loaders/demo/judge.py (JUDGE_PROMPTS), judges each image, saves a grid:
`python -m specar.tooling evaluate-demo --out docs/figures/demo_prompts.png`.
"""
from __future__ import annotations

import json
import os

import torch

from ..cli.args import positive_int
from .demo_judge import JUDGE_PROMPTS, PromptJudge
from ..model_loaders.registry import load_model
from ..samplers.api import generate
from ..samplers.backends import BACKENDS


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")


def add_arguments(ap) -> None:
    ap.add_argument("--backend", default="sjd_pac", choices=list(BACKENDS), help="how the images are sampled")
    ap.add_argument("--samples", type=positive_int, default=1, help="samples per prompt (seeds 0..n-1)")
    ap.add_argument("--out", default="output/demo_prompts.png",
                    help="the grid image (.png, .jpg or .webp), or a folder to write demo_prompts.png into")
    ap.add_argument("--json", help="also write every verdict to this JSON file")
    ap.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")


def output_paths(out: str, json_path=None):
    """(grid image path, json path) checked and their folders created before any work: a bad --out
    must not throw away the generation."""
    if os.path.isdir(out) or out.endswith(("/", os.sep)) or not os.path.splitext(out)[1]:
        out = os.path.join(out, "demo_prompts.png")
    if not out.lower().endswith(IMAGE_EXTENSIONS):
        raise ValueError(f"--out must be an image file ({', '.join(IMAGE_EXTENSIONS)}) or a folder, got {out!r}")
    for path in filter(None, (out, json_path)):
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise ValueError(f"cannot write into {folder!r} (for {path!r})")
    return out, json_path


def run(args):
    args.out, args.json = output_paths(args.out, args.json)
    torch.set_num_threads(args.threads)
    from PIL import Image
    model = load_model("demo")
    judge = PromptJudge()
    rows, passed, total = [], 0, 0
    for i, prompt in enumerate(JUDGE_PROMPTS):
        for s in range(args.samples):
            res = generate(model, prompt, backend=args.backend, seed=1000 * s + i)
            verdict = judge.judge(res.image, prompt)
            passed += verdict["ok"]
            total += 1
            rows.append({"prompt": prompt, "seed": 1000 * s + i, **verdict})
            print(f"{'PASS' if verdict['ok'] else 'fail'}  {prompt:55s} seen {verdict['seen']}", flush=True)
            if s == 0:
                rows[-1]["image"] = res.image
    print(f"\n{passed} of {total} samples follow their prompt (shape, colour and background), "
          f"judge accuracy on real procedural scenes is checked in tests")
    images = [r.pop("image") for r in rows if "image" in r]
    w = images[0].width
    grid = Image.new("RGB", (8 * (w + 2), 2 * (w + 2)), "white")
    for k, im in enumerate(images[:16]):
        grid.paste(im.resize((w, w)), ((k % 8) * (w + 2), (k // 8) * (w + 2)))
    grid = grid.resize((grid.width * 2, grid.height * 2), Image.NEAREST)
    grid.save(args.out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"passed": passed, "total": total, "backend": args.backend, "rows": rows}, f, indent=1)
    return passed, total
