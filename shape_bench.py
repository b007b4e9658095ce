"""`python -m specar shape-bench`: forward latency of L-token windows on a real 7B AR image model's
shape (random weights), and the sampling core's per-step cost against it.

Trained 7B weights cannot be downloaded here, and speed does not depend on the weights: a
random-weight model of Lumina-mGPT / Chameleon 7B's shape (hidden 4096, 32 layers, 32 heads,
MLP 11008, vocabulary 65536 of which 8192 image codes) in bf16 gives the real forward cost. We
time, with CFG as a batch of two on a context of `--context` tokens:
  - one forward of a chain of 1, 16, 32, 64 tokens (the step of AR and of windowed backends);
  - the sampling core's work per step at the same window: target distribution (CFG, top-k),
    MRS over the window, residual and fresh sampling, coupling re-drafts, and proactive tree
    building (K=4, D=3), i.e. everything the engine does besides the forward.
`--small` runs a tiny shape so the script itself is testable on a CPU.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from .model_loaders.llama import LlamaConfig, LlamaDecoder, rope_tables
from .samplers.randomness import exponential_noise, sample_by_race
from .samplers.target import SamplingParams, target_probs
from .samplers.verify import maximal_coupling, verify_candidates, verify_chain

SHAPES = {
    "chameleon-7b": dict(vocab_size=65536, hidden_size=4096, num_layers=32, num_heads=32, intermediate_size=11008,
                         image_codes=8192, top_k=2000),
    "small": dict(vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=176,
                  image_codes=1024, top_k=200),
}


def _timer(device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def measure(fn, repeats):
        fn()  # warm-up
        sync()
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        return (time.perf_counter() - t) / repeats

    return measure


def build(shape: dict, device, dtype, max_positions: int) -> LlamaDecoder:
    cfg = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], num_layers=shape["num_layers"],
                      num_heads=shape["num_heads"], intermediate_size=shape["intermediate_size"],
                      max_positions=max_positions)
    with torch.device("meta"):
        model = LlamaDecoder(cfg)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if prm.dim() == 1:
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, prm.shape[-1] ** -0.5, generator=g)
        model.rope_cos, model.rope_sin = rope_tables(cfg, device)
    return model.to(dtype).eval()


def core_step(p_logits_c, p_logits_u, sampling, V, T, gen, device):
    """The engine's per-step sampling work on [1, T, V] logits (CFG batch already split)."""
    p = target_probs(p_logits_c, p_logits_u, sampling)  # [1, T, V]
    if T == 1:  # AR: sample the next token, nothing else
        return sample_by_race(p, exponential_noise((1, 1, V), gen, device))
    q = torch.softmax(torch.randn(1, T - 1, V, device=device, generator=gen), -1)
    x = sample_by_race(q, exponential_noise((1, T - 1, V), gen, device))
    noise = exponential_noise((1, T, V), gen, device)
    u = torch.rand(1, T - 1, device=device, generator=gen)
    enabled = torch.ones(1, T - 1, dtype=torch.bool, device=device)
    n, out = verify_chain(p[:, :-1], q, x, u, noise[:, :-1], enabled)
    redraft = maximal_coupling(p[:, :-1], q, x, u, noise[:, :-1])
    fresh = sample_by_race(p, noise)
    # proactive tree: K=4 siblings without replacement at one position, D=3 deep
    keys = (exponential_noise((1, V), gen, device) / p[:, 0]).argsort(-1)[:, :4]
    deeper = sample_by_race(p[:, None, 1:3].expand(1, 3, 2, V), exponential_noise((1, 3, 2, V), gen, device))
    idx, tok = verify_candidates(p[:, 0], keys, torch.rand(1, 4, device=device, generator=gen), noise[:, 0], q=p[:, 0])
    return n, out, redraft, fresh, deeper, tok


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m specar shape-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="chameleon-7b", choices=list(SHAPES))
    ap.add_argument("--small", action="store_true", help="the tiny 'small' shape (CPU check of the script)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    shape = SHAPES["small" if args.small else args.shape]
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    T_max = max(args.windows) + 1
    model = build(shape, device, dtype, args.context + T_max + 8)
    V = shape["image_codes"]
    image_rows = slice(4, 4 + V)
    measure = _timer(device)
    rows = 2  # CFG: conditional and unconditional
    S = args.context + T_max + 1
    cache = model.new_cache(rows, S)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode():
        ctx = torch.randint(0, shape["vocab_size"], (rows, args.context), device=device, generator=gen)
        pos = torch.arange(args.context, device=device).expand(rows, -1)
        mask = (torch.arange(S, device=device)[None, :] <= torch.arange(args.context, device=device)[:, None])[None]
        model.hidden_states(ctx, pos, mask.expand(rows, -1, -1), cache, pos)
        sampling = SamplingParams(cfg_scale=3.0, temperature=1.0, top_k=shape["top_k"])
        results = []
        for L in args.windows:
            T = L if L == 1 else L + 1  # window L: pending token + L drafts
            tok = torch.randint(0, V, (rows, T), device=device, generator=gen)
            slots = args.context + torch.arange(T, device=device).expand(rows, -1)
            m = (torch.arange(S, device=device)[None, :] <= slots[0][:, None])[None].expand(rows, -1, -1)

            def fwd():
                h = model.hidden_states(tok, slots, m, cache, slots)
                return h @ model.lm_head.weight[image_rows].T

            t_fwd = measure(fwd, args.repeats)
            logits = fwd().float()
            t_core = measure(lambda: core_step(logits[:1], logits[1:], sampling, V, T, gen, device), args.repeats)
            results.append({"window": L, "tokens_per_forward": T, "forward_ms": 1e3 * t_fwd, "core_ms": 1e3 * t_core,
                            "core_share": t_core / (t_core + t_fwd)})
    base = results[0]["forward_ms"]
    print(f"shape {args.shape if not args.small else 'small'}, {args.dtype}, device {device}, context {args.context}, CFG batch 2")
    print(f"{'window':>6s} {'tokens':>6s} {'forward ms':>10s} {'x 1-token':>9s} {'core ms':>8s} {'core share':>10s}")
    for r in results:
        print(f"{r['window']:6d} {r['tokens_per_forward']:6d} {r['forward_ms']:10.2f} {r['forward_ms'] / base:9.2f} "
              f"{r['core_ms']:8.2f} {100 * r['core_share']:9.1f}%")
    if args.json:
        meta = {"shape": "small" if args.small else args.shape, "dtype": args.dtype, "device": str(device),
                "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                "machine": platform.platform(), "torch": torch.__version__, "context": args.context,
                "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
