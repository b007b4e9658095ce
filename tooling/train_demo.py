"""Reproduce the demo model's weights from scratch (CPU, fixed seed).

    python tooling/train_demo.py --out model_loaders/weights/demo

Steps: render the procedural dataset, fit the k-means patch codebook (demo_data.py),
tokenise every image, and train the Llama-style decoder on [bos, prompt words, boi, 256 image
codes] with 10% prompt dropout (the dropped prompt is exactly the unconditional branch the
adapter feeds for CFG: [bos, boi]). Writes codebook.safetensors, model.safetensors (fp16) and
config.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specar.model_loaders.demo.text import VOCAB, word_encoder
from specar.model_loaders.families.llama_adapter import BOI, BOS, IMAGE_OFFSET, PAD
from specar.model_loaders.llama_decoder import LlamaConfig, LlamaDecoder
from specar.tooling.demo_data import dataset, encode, fit_codebook, psnr

DEFAULTS = dict(images=24000, codes=1024, hidden_size=192, num_layers=6, num_heads=6, steps=3000, batch=32,
                lr=2e-3, prompt_dropout=0.1, seed=0, max_prompt=16)


def build_sequences(codes: torch.Tensor, prompts, encode, max_prompt: int, dropout: float, g: torch.Generator):
    """Left-padded token rows [n, max_prompt + 256] and the number of pad slots of each row."""
    n = codes.shape[0]
    rows = torch.full((n, max_prompt + codes[0].numel()), PAD, dtype=torch.long)
    pads = torch.zeros(n, dtype=torch.long)
    drop = torch.rand(n, generator=g) < dropout
    for i, text in enumerate(prompts):
        head = [BOS] + ([] if drop[i] else encode(text)) + [BOI]
        head = head[-max_prompt:]
        pads[i] = max_prompt - len(head)
        rows[i, pads[i]:max_prompt] = torch.tensor(head)
    rows[:, max_prompt:] = codes.flatten(1) + IMAGE_OFFSET
    return rows, pads


def train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    images, prompts, _ = dataset(args.images, seed=args.seed)
    held_out, _, _ = dataset(256, seed=args.seed + 10_000)
    codebook = fit_codebook(images, args.codes, iters=15, sample=200_000, seed=args.seed)
    recon_psnr = psnr(held_out, codebook.decode(encode(codebook, held_out)))
    codes = encode(codebook, images)
    print(f"data + codebook: {time.time() - t0:.0f} s, held-out reconstruction PSNR {recon_psnr:.2f} dB", flush=True)
    text_offset = IMAGE_OFFSET + args.codes
    encode = word_encoder(text_offset)
    g = torch.Generator().manual_seed(args.seed)
    rows, pads = build_sequences(codes, prompts, encode, args.max_prompt, args.prompt_dropout, g)
    cfg = LlamaConfig(vocab_size=text_offset + len(VOCAB), hidden_size=args.hidden_size, num_layers=args.num_layers,
                      num_heads=args.num_heads, max_positions=512)
    model = LlamaDecoder(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    L = rows.shape[1]
    P = args.max_prompt
    image_rows = slice(IMAGE_OFFSET, IMAGE_OFFSET + args.codes)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    model.train()
    t1 = time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(rows.shape[0], (args.batch,), generator=g)
        tok, pad = rows[idx], pads[idx]
        slot = torch.arange(L)
        valid = slot[None] >= pad[:, None]
        mask = (causal[None] & valid[:, None, :]) | torch.eye(L, dtype=torch.bool)[None]
        positions = (slot[None] - pad[:, None]).clamp(min=0)
        h = model.hidden_states(tok[:, :-1], positions[:, :-1], mask[:, :-1, :-1])
        logits = h[:, P - 1:] @ model.lm_head.weight[image_rows].T  # predictions of the 256 codes
        loss = F.cross_entropy(logits.reshape(-1, args.codes).float(), (tok[:, P:] - IMAGE_OFFSET).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t1
            print(f"step {step:5d} loss {loss.item():.4f} lr {lr:.2e} {el:.0f} s "
                  f"(eta {el / (step + 1) * (args.steps - step - 1) / 60:.1f} min)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    save_file({"centroids": codebook.centroids.contiguous()}, os.path.join(args.out, "codebook.safetensors"))
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()},
              os.path.join(args.out, "model.safetensors"))
    meta = {"llama": cfg.to_dict(), "codes": args.codes, "grid": [16, 16], "patch": 4, "image_size": 64,
            "text_vocab": VOCAB, "max_prompt_tokens": args.max_prompt,
            "default_sampling": {"cfg_scale": 3.0, "top_k": args.codes // 4},
            "training": {k: getattr(args, k) for k in DEFAULTS} | {"final_loss": round(loss.item(), 4),
                         "reconstruction_psnr_db": round(recon_psnr, 2), "parameters": n_params,
                         "wall_s": round(time.time() - t0), "threads": args.threads,
                         "command": "python tooling/train_demo.py --out " + args.out}}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"done in {time.time() - t0:.0f} s; wrote {args.out}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description="train the SpecAR demo model from scratch")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                 "model_loaders", "weights", "demo"))
    train(ap.parse_args(argv))


if __name__ == "__main__":
    main()
