"""Exact enumeration and the statistical checks every lossless backend is held to (the test suite and gpu-check's
exactness stage, tooling/gpu_check/exactness.py): `exact_distribution`, the probability of every complete image computed by teacher-forced
enumeration through the same target-distribution code plain AR uses; `chi_square_test`; the exactness cases.
"""
from __future__ import annotations

import itertools
from typing import Optional

import torch

from specar.model_loaders.tiny import tiny_model
from specar.samplers.randomness import exponential_from_uniform
from specar.samplers.target import SamplingParams, target_probs
from .calls import generate_kwargs


def exact_distribution(model, prompt, cfg_scale: Optional[float] = None, temperature: float = 1.0,
                       top_k: Optional[int] = None, top_p: float = 1.0, negative_prompt: str = "",
                       max_images: int = 1 << 16) -> dict:
    """Probability of every complete image under plain AR sampling with these settings.

    Returns {tuple(flattened image codes, raster order): probability}. All V^(H*W) images are
    teacher-forced through the model contract in one chain forward each (a code path separate
    from the engine's incremental steps), and the per-position target distributions come from
    the same `target_probs` the samplers use.
    """
    geo = model.geometry
    n, V = geo.num_image_tokens, geo.vocab_size
    if V ** n > max_images:
        raise ValueError(f"{V}^{n} images is too many to enumerate (max_images={max_images})")
    defaults = getattr(model, "default_sampling", {})
    sampling = SamplingParams(
        cfg_scale=defaults.get("cfg_scale", 1.0) if cfg_scale is None else cfg_scale, temperature=temperature,
        top_k=(defaults.get("top_k") or 0) if top_k is None else top_k, top_p=top_p).validated(V)
    encoded = model.encode_prompt(prompt, negative_prompt) if isinstance(prompt, str) else model.check_prompt(prompt)
    images = torch.tensor(list(itertools.product(range(V), repeat=n)), dtype=torch.long)  # [M, n]
    M = images.shape[0]
    forced = geo.forced_tokens()
    img_pos = geo.image_positions()
    seq = forced.expand(M, -1).clone()
    seq[:, img_pos] = images
    dev = model.device
    with torch.inference_mode():
        session = model.start(encoded, M, sampling.uses_cfg, draft_capacity=geo.seq_len)
        out = model.forward(session, seq[:, :-1].to(dev), [-1] + list(range(geo.seq_len - 2)))
        cond = torch.cat([session.first.cond, out.cond], 1)
        uncond = None if out.uncond is None else torch.cat([session.first.uncond, out.uncond], 1)
        probs = target_probs(cond, uncond, sampling).double().cpu()  # [M, seq_len, V]: p of position j
    per_pos = probs[:, img_pos].gather(-1, images.unsqueeze(-1)).squeeze(-1)  # [M, n]
    total = per_pos.prod(-1)
    return {tuple(img.tolist()): float(pr) for img, pr in zip(images, total)}



def greedy_and_argmax(model, backend: str, batch_size: int, **params):
    """For the greedy == argmax tests: `backend`'s images at temperature 0 (CFG 2.0, prompt "hi",
    seed 7) as [batch_size, H*W], the argmax image of the exact distribution, and its probability."""
    from specar.samplers.api import generate
    exact = exact_distribution(model, "hi", temperature=0.0, cfg_scale=2.0)
    (argmax_image, prob), = [(k, v) for k, v in exact.items() if v > 0.5]
    res = generate(model, "hi", **generate_kwargs(backend=backend, temperature=0.0, cfg_scale=2.0, **params), seed=7,
                   batch_size=batch_size)
    return res.tokens.reshape(batch_size, -1), torch.tensor(argmax_image), prob

def exponential_noise(shape, generator: torch.Generator, device) -> torch.Tensor:
    """Exp(1) noise in the open interval (0, inf) from the generator, as the engine draws it (the race's
    `exponential_from_uniform` of uniforms), for the tests of the verification primitives."""
    return exponential_from_uniform(torch.rand(shape, generator=generator, device=device))


def chi_square_test(samples: torch.Tensor, exact: dict, min_expected: float = 5.0):
    """Pearson chi-square goodness of fit of sampled images against an exact distribution.

    samples: [n, H, W] or [n, H*W] image codes. Outcomes with expected count below
    `min_expected` are pooled into one bin (so the chi-square approximation holds), as is any
    sampled image the exact distribution gives probability 0 (which, for a correct sampler,
    never happens). Returns (p_value, statistic, degrees_of_freedom, total_variation).
    """
    n = samples.shape[0]
    counts = {}
    for key in map(tuple, samples.reshape(n, -1).tolist()):
        counts[key] = counts.get(key, 0) + 1
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in set(counts) | set(exact))
    observed, expected = [], []
    pool_o, pool_e = 0.0, 0.0
    for key, prob in exact.items():
        e, o = prob * n, counts.pop(key, 0)
        if e >= min_expected:
            observed.append(o)
            expected.append(e)
        else:
            pool_o += o
            pool_e += e
    pool_o += sum(counts.values())  # images outside the support of the exact distribution
    if pool_o or pool_e:
        observed.append(pool_o)
        expected.append(max(pool_e, 1e-12))
    o = torch.tensor(observed, dtype=torch.float64)
    e = torch.tensor(expected, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    dof = max(len(observed) - 1, 1)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                            torch.tensor(stat / 2.0, dtype=torch.float64)))
    return p_value, stat, dof, tv


# ---------------------------------------------------------------------------------------------
# the exactness tests' shared cases (tests/test_exactness.py, test_hawk.py, test_adt_tree.py)

EXACTNESS_SAMPLES = 16000  # images per chi-square case: one batched generation
EXACTNESS_MODELS = {
    "v3-2x2": dict(vocab_size=3, grid=(2, 2), seed=0),
    "v3-2x3-rowend": dict(vocab_size=3, grid=(2, 3), seed=1, row_end=True),
    "v4-2x2": dict(vocab_size=4, grid=(2, 2), seed=2),
}
EXACTNESS_SETTINGS = {
    "plain": dict(),
    "cfg": dict(cfg_scale=2.5, negative_prompt="no"),
    "topk": dict(top_k=2),
    "topp": dict(top_p=0.8),
    "mixed": dict(cfg_scale=1.5, temperature=0.7, top_k=3, top_p=0.9),
    "t07-topk": dict(temperature=0.7, top_k=2),
}
_exactness_models: dict = {}


def exactness_model(name: str):
    """The tiny model `name` of EXACTNESS_MODELS, built once per process."""
    if name not in _exactness_models:
        _exactness_models[name] = tiny_model(**EXACTNESS_MODELS[name])
    return _exactness_models[name]


def check_exact(backend: str, model_name: str, setting: str, seed: int = 1234, n: int = EXACTNESS_SAMPLES,
                reproducible: bool = False, **params):
    """Sample `n` images with `backend` on an EXACTNESS_MODELS model at an EXACTNESS_SETTINGS
    setting; returns (chi_square_test against the exact distribution, the GenerationResult).
    reproducible=False by default: the statistical suites check each backend's own verification
    (rejection sampling, whose planted bugs they catch); in the reproducible mode the tokens are
    AR's by construction (tests/test_reproducible.py)."""
    from specar.samplers.api import generate
    mdl = exactness_model(model_name)
    kw = EXACTNESS_SETTINGS[setting]
    res = generate(mdl, "hi", **generate_kwargs(backend=backend, reproducible=reproducible, **kw, **params), seed=seed,
                   batch_size=n)
    return chi_square_test(res.tokens, exactness_distribution(model_name, setting)), res


_exactness_distributions: dict = {}


def exactness_distribution(model_name: str, setting: str) -> dict:
    """`exact_distribution` of an EXACTNESS_MODELS model at an EXACTNESS_SETTINGS setting, computed once
    per process (the suite's chi-square cases share a few dozen of them)."""
    key = (model_name, setting)
    if key not in _exactness_distributions:
        _exactness_distributions[key] = exact_distribution(exactness_model(model_name), "hi",
                                                           **EXACTNESS_SETTINGS[setting])
    return _exactness_distributions[key]


def mark_long(cases: list, quick, several_names: bool = False) -> list:
    """pytest parameters for `cases`: those whose index is in `quick` as they are, the others marked
    `long` (run by `make test-long`, not by `make test`). several_names: each case is the tuple of
    values of a parametrize over several names."""
    import pytest  # only the test suite calls this; pytest is a test dependency, not the package's
    return [c if i in quick else pytest.param(*(c if several_names else (c,)), marks=pytest.mark.long)
            for i, c in enumerate(cases)]


def use_drafter(monkeypatch, backend: str, drafter: type) -> None:
    """Run `backend` with another drafter class for one test (a test-side subclass: a planted
    bug, a policy, a recorder), through pytest's `monkeypatch` so it is undone afterwards: the class is
    bound to a name of this module, which the Method then names ("module:Class")."""
    import dataclasses
    import sys

    from specar.samplers.backends import SCHEMAS
    name = f"_test_drafter_{backend}"
    monkeypatch.setattr(sys.modules[__name__], name, drafter, raising=False)
    monkeypatch.setitem(SCHEMAS, backend, dataclasses.replace(SCHEMAS[backend], drafter=f"{__name__}:{name}"))


def reused_cache_differences(model, prompts, batch: int = 1, cfg: bool = True, tokens: int = 3) -> list:
    """Captured sessions (``start(captured=True)``) started one after another on `model` with the KV cache reuse of the
    CUDA-graph path switched on (slot_model.SlotCacheModel._session_cache; forced on the CPU here), against
    sessions with a cache of their own: the first logits and one `tokens`-token chain forward of each.
    Returns the prompts whose outputs differ and whether any cache was reused: ([], True) is a reuse nobody
    can see."""
    from specar.model_loaders import capture
    differ, reused, before = [], False, capture.GRAPH_BUFFERS_ON_CPU
    parents = [-1] + list(range(tokens - 1))
    chain = torch.zeros(batch, tokens, dtype=torch.long, device=model.device)
    try:
        with torch.inference_mode():
            outs = {}
            for on in (False, True):
                capture.GRAPH_BUFFERS_ON_CPU = on
                outs[on], caches = [], []
                for prompt in prompts:
                    s = model.start(model.encode_prompt(prompt), batch, cfg, draft_capacity=tokens, captured=True)
                    out = model.forward(s, chain, parents)
                    outs[on].append((s.first.cond.clone(), out.cond.clone()))
                    caches.append(s.state.cache)
                    del s, out  # the session ends: its cache may serve the next one
                if on:
                    reused = any(a is b for a, b in zip(caches, caches[1:]))
            for prompt, a, b in zip(prompts, outs[False], outs[True]):
                if not all(torch.equal(x, y) for x, y in zip(a, b)):
                    differ.append(prompt)
    finally:
        capture.GRAPH_BUFFERS_ON_CPU = before
    return differ, reused
