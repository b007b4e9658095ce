"""The sampler node's same_image_as_ar input: what the seed tooltip promises is true.

Through the node code (nodes/core.run_sampler, the values in the node's flat layout): with
same_image_as_ar on (the default), every backend run twice, and compiled, gives AR's image token for
token; off, a backend run twice gives its own image again. The tooltip names what repeats.
"""
import pytest
import torch

from specar.nodes import core, spec
from support import workflows
from specar.samplers.backends import SCHEMAS
from specar.model_loaders.tiny import tiny_model


@pytest.fixture(scope="module")
def model():
    mdl = tiny_model(16, (4, 4), seed=0, row_end=True)
    mdl.random_drafter_seed = 0  # hawk, adt_tree, spatial: random-weight drafters
    return mdl


def run(model, backend, **changes):
    values = workflows.sampler_values("a red circle", 5, backend=backend, batch_size=2, **changes)
    _, tokens, stats, _, _ = core.run_sampler(model, values)
    return tokens["tokens"], stats


def test_every_backend_gives_ars_image_twice(model):
    want, _ = run(model, "ar")
    assert want.shape == (2, 4, 4)
    for backend in SCHEMAS:
        for _ in range(2):
            got, _ = run(model, backend)
            assert torch.equal(got, want), f"{backend}: not AR's image with same_image_as_ar on"


def test_compiled_gives_the_same_image(model):
    """compile on and off: eager AR's image either way (one backend with one forward shape: compiling
    a shape takes about a minute on this machine; tests/test_compile.py compiles more)."""
    want, _ = run(model, "ar")
    got, _ = run(model, "sjd", compile=True, sjd_window=3)
    assert torch.equal(got, want)


def test_off_repeats_per_backend(model):
    for backend in ("sjd", "auto", "hawk"):
        extra = {"auto_cost_model": "forwards"} if backend == "auto" else {}
        a, _ = run(model, backend, same_image_as_ar=False, **extra)
        b, _ = run(model, backend, same_image_as_ar=False, **extra)
        assert torch.equal(a, b)


def test_lossy_needs_it_off(model):
    with pytest.raises(ValueError, match=r"adt_tree_relaxed on needs same_image_as_ar off \(now on\)"):
        run(model, "adt_tree", adt_tree_candidate_mode="topk", adt_tree_relaxed=True)
    run(model, "adt_tree", adt_tree_candidate_mode="topk", adt_tree_relaxed=True, same_image_as_ar=False)


def test_seed_tooltip_states_what_repeats():
    inputs = {w.name: w for w in spec.sampler_spec().inputs}
    seed = inputs["seed"].tooltip
    for phrase in ("same_image_as_ar on", "every lossless backend", "compile on or off", "any machine",
                   "plain AR's image", "float rounding", "With it off", "this machine",
                   "auto with cost_model measured", "can change from run to run"):
        assert phrase in seed, f"the seed tooltip does not say {phrase!r}"
    same = inputs["same_image_as_ar"]
    assert same.kind == "BOOLEAN" and same.default is True and same.optional


@pytest.mark.long
def test_every_backend_compiled_gives_ars_image(model):
    """The seed tooltip's "compile on or off" for every backend, not only sjd: each backend compiled (its
    forward shapes compiled once, a minute or more each on a CPU: make test-long) gives eager AR's image."""
    want, _ = run(model, "ar")
    for backend in SCHEMAS:
        got, _ = run(model, backend, compile=True)
        assert torch.equal(got, want), f"{backend} compiled: not AR's image with same_image_as_ar on"
