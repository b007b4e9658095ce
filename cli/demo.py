"""`python -m specar demo`: images of the embedded demo model, plain AR and the default backend, with
the speed-up measured in the same run (what `make demo` runs).

On a CPU: saves PNGs and a side-by-side grid under `--out`, and prints per image the backend, decode forward
passes, step compression, latency and the speedup over AR measured in the same run.
"""
from __future__ import annotations

import json
import os
import time

from . import schema
from ..samplers.backends import DEFAULT_BACKEND, SCHEMAS
from .args import non_negative_int, positive_int
from .model_spec import OFFLOADS, check_model_options

PROMPTS = [
    "a large red circle on a blue background",
    "a small yellow star on a noisy green background",
    "a white striped square on a black background",
    "a purple triangle on a noisy orange background",
]


def token_picture(tokens, vocab_size: int, scale: int = 8):
    """A stand-in picture for models without a decoder: one colour per code."""
    import torch
    from PIL import Image
    g = torch.Generator().manual_seed(0)
    palette = (torch.rand(vocab_size, 3, generator=g) * 255).to(torch.uint8)
    arr = palette[tokens].numpy()
    img = Image.fromarray(arr)  # uint8 H x W x 3: RGB (the mode argument is deprecated in Pillow 11.3)
    return img.resize((img.width * scale, img.height * scale), Image.NEAREST)


def side_by_side(rows, labels, prompts=None, pad: int = 4, scale: int = 2):
    """A grid: one row per configuration (labelled on the left), one column per prompt (its text
    under the column, wrapped), each image enlarged `scale` times (nearest neighbour)."""
    import textwrap

    from PIL import Image, ImageDraw
    rows = [[im.resize((im.width * scale, im.height * scale), Image.NEAREST) for im in images] for images in rows]
    w, h = rows[0][0].size
    cols = len(rows[0])
    chars = max(8, w // 6)  # PIL's default bitmap font is about 6 px per character
    captions = [textwrap.wrap(p, chars) for p in (prompts or [])]
    caption_h = 12 * max((len(c) for c in captions), default=0) + (pad if captions else 0)
    grid = Image.new("RGB", (cols * (w + pad) + pad + 60, len(rows) * (h + pad) + pad + caption_h), "white")
    draw = ImageDraw.Draw(grid)
    for r, images in enumerate(rows):
        draw.text((4, pad + r * (h + pad) + h // 2 - 6), labels[r], fill="black")
        for c, im in enumerate(images):
            grid.paste(im, (60 + pad + c * (w + pad), pad + r * (h + pad)))
    top = len(rows) * (h + pad) + pad
    for c, lines in enumerate(captions):
        for k, line in enumerate(lines):
            draw.text((60 + pad + c * (w + pad), top + 12 * k), line, fill="black")
    return grid


def add_arguments(ap) -> None:
    ap.add_argument("--model", default="demo", help="demo, or a model folder")
    ap.add_argument("--fast", help=f"the accelerated configuration, as bench's: backend[:key=value,...] (unset: "
                    f"{DEFAULT_BACKEND}, the library's default backend); backends: {', '.join(SCHEMAS)}")
    ap.add_argument("--prompts", nargs="+", default=PROMPTS, help="the prompts, one image each")
    ap.add_argument("--seed", type=non_negative_int, default=0, help="seed of the first prompt (+1 per prompt)")
    ap.add_argument("--out", default="output", help="folder for the PNGs, grid.png and demo.json")
    ap.add_argument("--threads", type=positive_int, help="torch CPU threads (unset: the cores other processes leave "
                    "free, at least 1)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (unset: the model's own choice)")
    ap.add_argument("--resolution", default=None, help="WIDTHxHEIGHT of a model folder's images, e.g. 768x768 "
                    "(unset: the model's own size; a size the model does not offer is refused naming those it does)")
    ap.add_argument("--offload", default="none", choices=list(OFFLOADS), help="auto: the weights that do not fit "
                    "the GPU stay in CPU memory (transformers-format models, Emu3.5; slow)")


def run(args):
    args.fast = args.fast or DEFAULT_BACKEND
    try:  # a bad --fast or --model fails before torch is imported
        schema.parse_config(args.fast)
    except ValueError as e:
        raise ValueError(f"--fast {args.fast!r}: {e}") from None
    check_model_options(args.model, resolution=args.resolution, offload=args.offload, device=args.device)

    import torch

    from ..samplers.api import generate
    from .benchmark import parse_config
    from .machine import busy_note, choose_threads, machine
    from .model_spec import model_from_spec
    try:  # the registry's own checks
        configs = [{"backend": "ar"}, parse_config(args.fast)]
    except ValueError as e:
        raise ValueError(f"--fast {args.fast!r}: {e}") from None
    started = machine()  # the machine and its load at the start (the JSON's record)
    args.threads = choose_threads(args.threads)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    model = model_from_spec(args.model, args.device, resolution=args.resolution, offload=args.offload)
    for cfg in configs:  # warm-up, so neither side pays first-call costs in the comparison
        generate(model, args.prompts[0], seed=args.seed, **schema.generate_args(cfg))
    pictures = {0: [], 1: []}
    report, totals, lossy, same, reproducible = [], {0: 0.0, 1: 0.0}, False, 0, True
    ar_tokens = None
    for i, prompt in enumerate(args.prompts):
        for c, cfg in enumerate(configs):
            res = generate(model, prompt, seed=args.seed + i, **schema.generate_args(cfg))
            st = res.stats
            pic = res.image if res.image is not None else token_picture(res.tokens, model.geometry.vocab_size)
            pic.save(os.path.join(args.out, f"{i:02d}_{cfg['backend']}.png"))
            pictures[c].append(pic)
            totals[c] += st.latency_s
            lossy = lossy or bool(st.lossy)
            reproducible = reproducible and bool(st.reproducible)
            if c == 0:
                ar_tokens = res.tokens
            else:
                same += int(torch.equal(res.tokens, ar_tokens))
            report.append({"prompt": prompt, "backend": cfg["backend"], "params": st.params, "nfe": st.nfe,
                           "step_compression": st.step_compression, "latency_s": st.latency_s})
            print(f"{prompt[:48]:48s} {cfg['backend']:8s} forwards {st.nfe:4d}  compression {st.step_compression:5.2f}x  "
                  f"latency {st.latency_s:6.2f} s")
    grid_labels = ["AR", configs[1]["backend"]]  # the rows' labels drawn on grid.png (recorded in demo.json)
    side_by_side([pictures[0], pictures[1]], grid_labels, args.prompts).save(os.path.join(args.out, "grid.png"))
    speedup = totals[0] / totals[1]
    verdict = "LOSSY (relaxed acceptance: not AR's distribution), " if lossy else ""
    verdict += f"{speedup:.2f}x " + ("faster" if speedup >= 1 else "slower: AR was faster")
    print(f"\n{configs[1]['backend']} vs AR over {len(args.prompts)} prompts, same run: {verdict} "
          f"(total latency {totals[0]:.2f} s -> {totals[1]:.2f} s, {args.threads} torch threads). Images in "
          f"{args.out}/ (grid.png: AR top row)")
    busy = busy_note(args.threads)
    if busy:
        print(busy)
    if not lossy and reproducible:  # the default: "same image as AR" (docs/REPRODUCIBLE.md)
        print(f"{same} of {len(args.prompts)} images are token for token AR's: in the 'same image as AR' mode (the "
              f"default) {configs[1]['backend']} keeps a draft only where it is AR's own sample for the seed.")
    elif not lossy:
        print(f"The two rows differ image by image: {configs[1]['backend']} draws its own random samples, from the same "
              f"distribution as AR's (lossless), not AR's images.")
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump({"command": args.command_line, "date": time.strftime("%Y-%m-%d"), **started,
                   "threads": args.threads, "grid_labels": grid_labels, "speedup_vs_ar": speedup, "images_equal_to_ar": same, "runs": report},
                  f, indent=1)
    return speedup
