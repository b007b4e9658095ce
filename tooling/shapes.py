"""The random-weight Llama shapes the tooling times (shape-bench, gpu-check's forward_7b): Lumina-mGPT /
Chameleon 7B's shape, and a tiny one for checking a command on the CPU. Speed does not depend on the weights."""
from __future__ import annotations

import torch

SHAPES = {
    "chameleon-7b": dict(name="Lumina-mGPT 7B shape (random weights)", vocab_size=65536, hidden_size=4096,
                         num_layers=32, num_heads=32, intermediate_size=11008, image_codes=8192, top_k=2000, grid=48),
    "small": dict(name="tiny Llama", vocab_size=2048, hidden_size=64, num_layers=2, num_heads=4,
                  intermediate_size=176, image_codes=1024, top_k=200, grid=8),
}


def random_decoder(shape: dict, device, dtype, max_positions: int):
    """A random-weight LlamaDecoder allocated directly on `device` in `dtype` (no float32 copy of the 7B
    weights, no file)."""
    from ..model_loaders.llama_decoder import LlamaConfig, LlamaDecoder, rope_tables
    cfg = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                      num_layers=shape["num_layers"], num_heads=shape["num_heads"],
                      intermediate_size=shape["intermediate_size"], max_positions=max_positions)
    with torch.device("meta"):
        dec = LlamaDecoder(cfg)
    dec = random_init_(dec.to(dtype=dtype).to_empty(device=device), device)
    with torch.no_grad():
        cos, sin = rope_tables(cfg, device)
        dec.rope_cos, dec.rope_sin = cos.to(dtype), sin.to(dtype)  # as load_model's .to(dtype) leaves them
    return dec.eval()


def random_init_(module, device, seed: int = 0):
    """`module`'s parameters (allocated, e.g. by ``to_empty``) filled in place: vectors (norm weights) 1, biases of
    norms too (a random-weight model needs no more), matrices normal with std 1/sqrt(fan-in); returns it."""
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for _, prm in module.named_parameters():
            if prm.dim() == 1:
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, prm.shape[-1] ** -0.5, generator=g)
    return module


def sync(device) -> None:
    """Wait for the device's queued work (a CUDA timing's end); nothing on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


__all__ = ["SHAPES", "random_decoder", "random_init_", "sync"]
