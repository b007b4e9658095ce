"""Shape pinning (model_loaders/precision/batch_invariant.py: `ShapePinned`, `pinned_forward`; the engine's
`pin_width`): every target forward of a generation at one width, AR's one token padded to it.

- padding changes nothing: in float32 every backend pinned at its verify width, and AR padded to it, give plain AR's
  sequence; a planted padding that sits before the real nodes (their KV slots shifted) fails it
- a pinned forward's real nodes do not depend on the padding tokens (bit-equal at the same shape)
- the forward mode: pinning where `pin_width` asks or on a device of `PINNED_DEVICES` (then no float64 mode), the guarantee
  names the case and the width; bad widths are refused naming the value and what is allowed
- an adaptive drafter's forward costs under pinning: every shape costs the pinned forward
- (long) the demo model in bf16 on the CPU: pinning on, sjd's tokens are AR's (padded to sjd's width); off, they
  differ (planted); pinning alone is not enough here for every backend (docs/REPRODUCIBLE.md, "Shape pinning")
"""
import contextlib

import pytest
import torch

import specar
from specar.model_loaders.precision import batch_invariant
from specar.model_loaders.precision.batch_invariant import BatchInvariant, SameImage, ShapePinned, pinned_forward
from specar.samplers.backends import BACKENDS, make_backend
from specar.model_loaders.tiny import tiny_model
from support.calls import generate_kwargs

FLOAT32, PINNED = SameImage.TESTED, SameImage.SHAPE_PINNED

KW = dict(seed=1, batch_size=2, cfg_scale=2.0, temperature=0.9, top_k=6)


@pytest.fixture(scope="module")
def model():
    return tiny_model(16, (4, 5), seed=3, row_end=True)


def test_every_backend_pinned_and_ar_padded_to_it_give_plain_ars_sequence(model):
    plain = specar.generate(model, "hi", **generate_kwargs(backend="ar", **KW)).sequence
    for backend in BACKENDS:
        width = make_backend(backend).verify_width(model)
        got = specar.generate(model, "hi", **generate_kwargs(backend=backend, pin_width=width, **KW))
        assert got.stats.same_image_guarantee == FLOAT32
        assert got.stats.same_image_reason.endswith(f"(every forward at {width} tokens)")
        assert torch.equal(got.sequence, plain), backend
    wide = make_backend("sjd_pac").verify_width(model) + 5
    assert torch.equal(specar.generate(model, "hi",
                                       **generate_kwargs(backend="ar", pin_width=wide, **KW)).sequence, plain)


def test_a_planted_padding_before_the_real_nodes_is_caught(model, monkeypatch):
    def pads_first(model, session, tokens, parents, width):  # planted: the real nodes' slots shifted by the pads
        B, T = tokens.shape
        pad = width - T
        out = model.forward(session, torch.cat([tokens.new_zeros(B, pad), tokens], 1),
                            [-1] * pad + [p if p < 0 else p + pad for p in parents])
        return type(out)(*(None if t is None else t[:, pad:] for t in (out.cond, out.uncond, out.hidden,
                                                                       out.hidden_uncond)))

    plain = specar.generate(model, "hi", **generate_kwargs(backend="ar", **KW)).sequence
    monkeypatch.setattr(batch_invariant, "pinned_forward", pads_first)
    assert not torch.equal(specar.generate(model, "hi",
                                           **generate_kwargs(backend="ar", pin_width=9, **KW)).sequence, plain)


def test_the_real_nodes_of_a_pinned_forward_do_not_see_the_padding(model):
    prompt = model.encode_prompt("hi", "")
    tokens, parents = torch.tensor([[3, 5, 7, 1], [2, 2, 9, 4]]), [-1, 0, 0, 2]
    outs = []
    with torch.inference_mode():
        for pad in (0, 11):  # the same shape, other padding tokens and parents
            session = model.start(prompt, 2, True, draft_capacity=12)
            if pad == 0:
                out = pinned_forward(model, session, tokens, parents, 11)
            else:
                full = model.forward(session, torch.cat([tokens, torch.full((2, 7), pad)], 1),
                                     parents + [3, 4, 5, 6, 7, 8, 9])  # a chain hanging under node 3
                out = type(full)(*(t[:, :4] for t in (full.cond, full.uncond, full.hidden, full.hidden_uncond)))
            outs.append(out)
    assert outs[0].cond.shape == (2, 4, 16) and outs[0].hidden.shape[1] == 4
    for field in ("cond", "uncond", "hidden", "hidden_uncond"):
        assert torch.equal(getattr(outs[0], field), getattr(outs[1], field)), field
    with pytest.raises(ValueError, match="does not fit the pinned width 3"):
        pinned_forward(model, None, tokens, parents, 3)


def test_the_forward_mode_pins_where_asked_or_verified_and_names_the_case(model, monkeypatch):
    bf16 = tiny_model(16, (2, 3), row_end=True)
    bf16.torch_module().to(torch.bfloat16)
    assert batch_invariant.target_forward_mode(bf16, True, 9) == (ShapePinned, SameImage.NOT_GUARANTEED,
                                                   "shape-pinned bfloat16 on cpu, not verified there")
    assert batch_invariant.target_forward_mode(bf16, False, 9) == (contextlib.nullcontext, None, None)
    monkeypatch.setattr(batch_invariant, "PINNED_DEVICES", frozenset({"cpu"}))  # as a GPU run would set "cuda"
    assert batch_invariant.target_forward_mode(bf16, True)[:2] == (ShapePinned, PINNED)

    def entered(*args, **kwargs):
        raise AssertionError("the float64 mode ran")

    monkeypatch.setattr(BatchInvariant, "__torch_function__", entered)
    r = specar.generate(bf16, "hi", backend="sjd", seed=0, sampling=dict(cfg_scale=2.0))  # pinned: no float64 forwards
    assert r.stats.same_image_guarantee == PINNED
    assert r.stats.same_image_reason.endswith(f"(every forward at {batch_invariant.PINNED_WIDTH} tokens)")
    ar = specar.generate(bf16, "hi", backend="ar", seed=0, sampling=dict(cfg_scale=2.0))  # AR pads to the same width
    assert (ar.stats.same_image_guarantee, ar.stats.same_image_reason) == \
        (r.stats.same_image_guarantee, r.stats.same_image_reason)
    monkeypatch.setattr(batch_invariant, "PINNED_WIDTH", 3)  # a backend wider than the pinned width: said so
    r = specar.generate(bf16, "hi", backend="sjd", seed=0, sampling=dict(cfg_scale=2.0))
    assert r.stats.same_image_guarantee == SameImage.NOT_GUARANTEED
    assert r.stats.same_image_reason.startswith("sjd's forwards of ")


@pytest.mark.parametrize("bad", [3, 0, True, 2.5, "9"])
def test_a_bad_pin_width_is_refused(model, bad):
    width = make_backend("sjd", window=4).verify_width(model)
    with pytest.raises(ValueError, match=rf"pin_width must be an int >= {width} \(sjd's widest forward\), got"):
        specar.generate(model, "hi", backend=specar.make_backend("sjd", window=4),
                        options=dict(pin_width=bad if bad != 3 else width - 1))
    with pytest.raises(ValueError, match="needs reproducible"):
        specar.generate(model, "hi", backend=specar.make_backend("sjd", window=4),
                        options=dict(pin_width=width, reproducible=False))


def test_adaptive_forward_costs_under_pinning_are_the_pinned_forwards(model):
    from types import SimpleNamespace

    from specar.model_loaders.precision.batch_invariant import SameImagePlan
    from specar.samplers.forward_costs import calibrate

    shapes = {0: [-1], 4: [-1, 0, 1, 2], 8: list(range(-1, 7))}  # auto's side: the shapes it may choose
    ctx = SimpleNamespace(model=model, batch=1, compiled=False, same_image=SameImagePlan(ShapePinned, 9, None, None))
    with torch.inference_mode():
        session = model.start(model.encode_prompt("hi", ""), 1, True, draft_capacity=10)
        costs = calibrate(ctx, session, lambda: None, shapes)
    assert set(costs) == {0, 4, 8} and len(set(costs.values())) == 1


@pytest.mark.long
def test_demo_in_bf16_pinning_on_and_off():
    demo = specar.load_model("demo", dtype="bfloat16")
    prompt = "a small yellow star on a noisy green background"
    width = make_backend("sjd").verify_width(demo)
    ar = specar.generate(demo, prompt, backend="ar", seed=0, options=dict(pin_width=width)).tokens
    assert torch.equal(specar.generate(demo, prompt, backend="sjd", seed=0, options=dict(pin_width=width)).tokens, ar)
    with pytest.MonkeyPatch.context() as mp:  # planted: the forwards neither pinned nor float64
        mp.setattr(batch_invariant, "target_forward_mode", lambda model, reproducible, pin_width=None:
                   (contextlib.nullcontext, SameImage.NOT_GUARANTEED, "planted: plain forwards"))
        plain_ar = specar.generate(demo, prompt, backend="ar", seed=0).tokens
        plain = specar.generate(demo, prompt, backend="sjd", seed=0).tokens
    assert not torch.equal(plain, plain_ar), "plain bf16 gave AR's image: the check above has no power here"
