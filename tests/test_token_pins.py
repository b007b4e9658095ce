"""Refactors of the sampling core must not change a single sampled token.

`tests/data/token_pins.json` holds, for every backend and parameter set the exactness suite
uses (and a few on a larger row-end model), a hash of the tokens a fixed seed gives. It was
recorded by running this file as a script (`python tests/test_token_pins.py --record`) on the
code before the drafter refactor; the test regenerates the hashes with the current code and
compares. A deliberate change of the random stream (a new draw order) must re-record the file
and say why in the commit message.
"""
import hashlib
import json
import os
import sys

import pytest
import torch

import specar
from support.exactness import EXACTNESS_MODELS, EXACTNESS_SETTINGS, tiny_model
from support.calls import generate_kwargs

PINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "token_pins.json")
# the exactness suite's models and settings (tests/support/exactness.py), plus a larger row-end model and greedy
MODELS = {**EXACTNESS_MODELS, "v16-4x5-rowend": dict(vocab_size=16, grid=(4, 5), seed=3, row_end=True)}
SETTINGS = {**{k: EXACTNESS_SETTINGS[k] for k in ("plain", "cfg", "topk", "topp", "mixed")},
            "greedy": dict(temperature=0.0, cfg_scale=2.0)}
BACKEND_CASES = [("ar", {})]
# restart_after=5 where a case names no restart: the pins were recorded when 5 was the default of sjd, scd and
# sjd_pac (now 0: docs/BENCHMARKS.md, "Defaults chosen on every regime"); named, the pins keep
# pinning the same configurations
BACKEND_CASES += [("sjd", dict(window=w, init=i, restart_after=5)) for w in (1, 3, 16)
                  for i in ("random", "repeat_left", "repeat_above", "sample_left", "sample_above")]
BACKEND_CASES += [("scd", dict(window=w, init=i, coupling=c, coupling_strength=a, restart_after=5))
                  for c in ("maximal", "gumbel") for a in (1.0, 0.5) for w, i in ((3, "random"), (16, "sample_above"))]
# init="random" where a case names no init: the pins were recorded when random was sjd_pac's default
BACKEND_CASES += [("sjd_pac", dict(window=w, tree_depth=d, tree_width=k, **{"init": "random", "restart_after": 5, **x}))
                  for w, d, k, x in (
    (3, 1, 2, {}), (3, 2, 3, {}), (16, 3, 3, {}), (2, 2, 3, dict(init="sample_left")),
    (16, 3, 3, dict(continuation=False)), (4, 3, 2, dict(coupling="gumbel")), (16, 2, 3, dict(init="repeat_above")),
    (5, 3, 3, dict(init="sample_above")), (16, 3, 4, {}), (64, 3, 4, {}))]
# every case above runs in the rejection-sampling mode (reproducible=False: each backend's own draws, as
# pinned before the reproducible mode existed); AR in the reproducible mode, the default now,
# is pinned last (its own draws; every lossless backend gives its tokens there: tests/test_reproducible.py)
BACKEND_CASES += [("ar", dict(reproducible=True))]


# every registered backend (samplers/backends.py, so a new one is pinned too) at its defaults and at its paper
# preset, in both modes (reproducible: "same image as AR", the default; and each backend's own rejection
# sampling), with CFG, on a row-end model and a larger grid; auto with its deterministic cost model (its
# measured one follows the clock). Recorded before a restructuring of the engine, so it lands on them.
REGISTRY_MODELS = {"v16-4x5-rowend": MODELS["v16-4x5-rowend"], "v8-6x7": dict(vocab_size=8, grid=(6, 7), seed=5)}
REGISTRY_SETTING = dict(cfg_scale=2.0, temperature=0.9, top_k=6)


def registry_cases():
    from specar.samplers.backends import BACKENDS
    out = []
    for backend in BACKENDS:
        for preset in ("default", "paper"):
            for reproducible in (True, False):
                for m in REGISTRY_MODELS:
                    out.append((backend, preset, reproducible, m))
    return out


def registry_case_id(case):
    backend, preset, reproducible, m = case
    return f"registry-{backend}-{preset}-{'same' if reproducible else 'own'}-{m}"


def registry_token_hash(case) -> str:
    backend, preset, reproducible, m = case
    if m not in _models:
        _models[m] = tiny_model(**REGISTRY_MODELS[m])
    # the settings a machine's timings choose are pinned at a fixed value: auto's window by forward counts, Hawk's and
    # ADT-Tree's node_budget=0 (chosen from measured costs) at 8, the budget these hashes were recorded with
    extra = dict(cost_model="forwards") if backend == "auto" else {}
    if backend in ("hawk", "adt_tree") and preset == "default":
        extra = dict(node_budget=8)
    res = specar.generate(_models[m], "hi",
                          **generate_kwargs(backend=backend, preset=preset, reproducible=reproducible,
                                            **REGISTRY_SETTING, **extra),
                          seed=77, batch_size=6)
    return hashlib.sha256(res.sequence.numpy().tobytes()).hexdigest()[:16]


def cases():
    out = []
    for i, (backend, params) in enumerate(BACKEND_CASES):
        for j, m in enumerate(MODELS):
            s = list(SETTINGS)[(i + j) % len(SETTINGS)]
            if params.get("tree_width", 1) <= MODELS[m]["vocab_size"]:
                out.append((backend, params, m, s))
    return out


def case_id(case):
    backend, params, m, s = case
    return "-".join([backend] + [f"{k}={v}" for k, v in sorted(params.items())] + [m, s])


_models = {}


def token_hash(case) -> str:
    backend, params, m, s = case
    if m not in _models:
        _models[m] = tiny_model(**MODELS[m])
    mdl = _models[m]
    kw = dict(SETTINGS[s])
    if "top_k" in kw:
        kw["top_k"] = min(kw["top_k"], mdl.geometry.vocab_size)
    res = specar.generate(mdl, "hi", **generate_kwargs(backend=backend, **kw, **{"reproducible": False, **params}),
                          seed=1234, batch_size=24)
    return hashlib.sha256(res.sequence.numpy().tobytes()).hexdigest()[:16]


def _pins():
    with open(PINS) as f:
        return json.load(f)


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_tokens_unchanged(case):
    pins = _pins()
    key = case_id(case)
    assert key in pins, f"no pinned hash for {key}: record with python tests/test_token_pins.py --record"
    assert token_hash(case) == pins[key], f"{key}: the sampled tokens changed"


@pytest.mark.parametrize("case", registry_cases(), ids=registry_case_id)
def test_registry_tokens_unchanged(case):
    pins = _pins()
    key = registry_case_id(case)
    assert key in pins, f"no pinned hash for {key}: record with python tests/test_token_pins.py --record"
    assert registry_token_hash(case) == pins[key], f"{key}: the sampled tokens changed"


if __name__ == "__main__" and "--record" in sys.argv:
    torch.set_num_threads(1)
    pins = {case_id(c): token_hash(c) for c in cases()}
    pins.update({registry_case_id(c): registry_token_hash(c) for c in registry_cases()})
    os.makedirs(os.path.dirname(PINS), exist_ok=True)
    with open(PINS, "w") as f:
        json.dump(pins, f, indent=1, sort_keys=True)
    print(f"recorded {len(pins)} hashes in {PINS}")
