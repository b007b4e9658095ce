"""Weight-only int8 / int4 quantization (model_loaders/precision/quantize.py): the arithmetic, the memory, the
loader input, the compiled step, and exactness of speculative decoding with respect to the
QUANTIZED target (chi-square against the enumerated distribution of the quantized model, with a
planted verification bug caught on the same model)."""

import pytest
import torch
from torch import nn

import specar
from specar.model_loaders.precision.quantize import QuantLinear, check_mode, quantize_module
from specar.samplers.api import generate
from specar.samplers.compiled_step.step_graphs import compile_stats
from specar.samplers.drafters.jacobi import drafter as jacobi_mod
from support.exactness import EXACTNESS_SAMPLES, chi_square_test, exact_distribution, tiny_model
from specar import make_backend
from support.calls import generate_kwargs

P_FAIL = 1e-6


@pytest.mark.parametrize("bits,group", [(8, 128), (4, 128), (4, 32)])
def test_dequantized_weight_is_within_half_a_step_and_forward_uses_it(bits, group):
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(256, 48, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 256, generator=g))
        lin.bias.copy_(torch.randn(48, generator=g))
    q = QuantLinear.from_linear(lin, bits, group)
    w = q.dequantized_weight(torch.float32)
    levels = 127 if bits == 8 else 7
    if bits == 8:
        step = lin.weight.abs().amax(-1, keepdim=True) / levels
    else:
        step = (lin.weight.reshape(48, -1, group).abs().amax(-1, keepdim=True) / levels).expand(48, 256 // group, group) \
            .reshape(48, 256)
    assert ((w - lin.weight).abs() <= step / 2 + 1e-6).all()
    assert (w - lin.weight).abs().max() > 0  # it did quantize
    x = torch.randn(3, 5, 256, generator=g)
    # 1e-4: the two products may sum their 256 terms in another order (BLAS blocking depends on the thread count);
    # a forward on the unquantized weight is off by 0.5 (int8) to 7 (int4) here
    torch.testing.assert_close(q(x), torch.nn.functional.linear(x, w, lin.bias), rtol=1e-4, atol=1e-4)


def test_int4_codes_round_trip_exactly():
    # weights that are exactly code * scale (the group's max at code 7) come back unchanged: packing is lossless
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-7, 8, (16, 64), generator=g).float()  # symmetric: max |code| 7
    codes[:, ::32] = 7.0
    lin = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(codes * 0.25)
    q = QuantLinear.from_linear(lin, 4, 32)
    assert q.qweight.dtype == torch.uint8 and q.qweight.numel() == 16 * 64 // 2
    torch.testing.assert_close(q.dequantized_weight(torch.float32), lin.weight, rtol=0, atol=0)


def test_memory_of_a_7b_width_layer_int4_at_most_35_percent_of_bf16():
    # one Lumina-mGPT / Anole 7B MLP projection (4096 -> 11008) in bf16, then quantized
    lin = nn.Linear(4096, 11008, bias=False, dtype=torch.bfloat16)
    bf16 = lin.weight.numel() * 2
    m4 = nn.Sequential(lin)
    rep4 = quantize_module(m4, "int4")
    assert rep4.layers == 1 and rep4.bytes_before == bf16
    assert rep4.bytes_after <= 0.35 * bf16, rep4
    m8 = nn.Sequential(nn.Linear(4096, 11008, bias=False, dtype=torch.bfloat16))
    rep8 = quantize_module(m8, "int8")
    assert rep8.bytes_after <= 0.55 * bf16, rep8


def test_modes_and_errors(monkeypatch):
    import dataclasses

    from specar.model_loaders import registry
    assert check_mode(None) == "none" and check_mode("INT4") == "int4"
    with pytest.raises(ValueError, match="quantize must be one of none, int8, int4.*'int3'"):
        check_mode("int3")
    assert any(isinstance(m, QuantLinear) for m in specar.load_model("demo", quantize="int4").decoder.modules())
    # a family whose loader does not quantize (every shipped one does) is refused, naming those that do
    demo = dataclasses.replace(registry.BUILTIN_MODELS["demo"], quantize=False)
    monkeypatch.setattr(registry, "family_of", lambda name: demo)
    with pytest.raises(ValueError, match="quantize='int4'.*quantized loading is offered for"):
        specar.load_model("demo", quantize="int4")
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    m.lm_head = nn.Linear(8, 8)
    rep = quantize_module(m, "int8")
    assert rep.layers == 2 and isinstance(m.lm_head, nn.Linear) and isinstance(m[0], QuantLinear)


def quantized_tiny(mode="int4", **kw):
    mdl = tiny_model(**kw)
    rep = quantize_module(mdl.torch_module(), mode, group_size=8)
    assert rep.layers > 0
    return mdl


def test_quantized_target_differs_from_the_float_model():
    # the test below is about the quantized model: its distribution is not the float model's
    float_exact = exact_distribution(tiny_model(vocab_size=3, grid=(2, 2), seed=0), "hi")
    q_exact = exact_distribution(quantized_tiny(vocab_size=3, grid=(2, 2), seed=0), "hi")
    tv = 0.5 * sum(abs(float_exact[k] - q_exact[k]) for k in float_exact)
    assert tv > 0.01, tv


# reproducible=False: each backend's own rejection sampling (the rule the planted bug below breaks); the last
# case: "same image as AR" (the default), verification by agreement
@pytest.mark.parametrize("mode,backend,params,reproducible", [
    ("int4", "sjd", dict(window=3, init="random"), False),
    ("int8", "scd", dict(window=16, coupling="maximal"), False),
    ("int4", "sjd_pac", dict(window=3, tree_depth=2, tree_width=3), False),
    ("int4", "sjd_pac", dict(window=3, tree_depth=2, tree_width=3), True)])
def test_speculative_decoding_is_exact_for_the_quantized_target(mode, backend, params, reproducible):
    mdl = quantized_tiny(mode, vocab_size=3, grid=(2, 2), seed=0)
    exact = exact_distribution(mdl, "hi", cfg_scale=2.0)
    res = generate(mdl, "hi", **generate_kwargs(backend=backend, cfg_scale=2.0, reproducible=reproducible, **params),
                   seed=11, batch_size=EXACTNESS_SAMPLES)
    p, stat, dof, tv = chi_square_test(res.tokens, exact)
    assert p > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p:.2e} TV={tv:.4f}"


def test_planted_stale_q_bug_is_caught_on_the_quantized_model(monkeypatch):
    orig = jacobi_mod.JacobiDrafter._redraft

    def stale(self, state, p, tpos, mrs_out, noise):  # the draft's recorded q is the OLD one
        y, _ = orig(self, state, p, tpos, mrs_out, noise)
        return y, state.draft.dist[state.rows[:, None], tpos % self.ring]

    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_redraft", stale)
    mdl = quantized_tiny("int4", vocab_size=3, grid=(2, 2), seed=0)
    # reproducible=False: the stale q matters to rejection sampling only (agreement never reads q)
    res = generate(mdl, "hi", backend=make_backend("sjd", window=3, init="random"), seed=11,
                   batch_size=EXACTNESS_SAMPLES, options=dict(reproducible=False))
    p, stat, dof, tv = chi_square_test(res.tokens, exact_distribution(mdl, "hi"))
    assert p < P_FAIL, f"planted bug went unnoticed: p={p:.2e} TV={tv:.4f}"


def test_compiled_step_on_a_quantized_model_gives_eager_tokens():
    mdl = quantized_tiny("int4", vocab_size=4, grid=(2, 2), seed=2)
    eager = generate(mdl, "hi", backend=make_backend("sjd", window=3), seed=5, batch_size=4)
    compiled = generate(mdl, "hi", backend=make_backend("sjd", window=3), seed=5, batch_size=4,
                        options=dict(compile=True))
    stats = compile_stats(mdl)
    assert stats.eager_fallback == "" and stats.graph_breaks == 0 and stats.compiles >= 1
    assert torch.equal(eager.tokens, compiled.tokens)


@pytest.mark.parametrize("choice,expected", [("int4", {"quantize": "int4"}), ("none", {})])
def test_loader_node_input_reaches_load_model(monkeypatch, choice, expected):
    from specar.nodes import models
    from specar.nodes.spec import loader_spec
    seen = {}

    def fake_load(path, device=None, dtype=None, **options):
        seen.update(options)
        return object()

    monkeypatch.setattr(models, "load_model", fake_load)
    monkeypatch.setattr(models, "_cache", {})
    widget = next(w for w in loader_spec(lambda: ["demo"]).inputs if w.name == "quantize")
    assert tuple(widget.options) == ("none", "int8", "int4") and widget.default == "none"
    models.load_cached(model="demo", device="cpu", dtype="auto", resolution="model default", offload="none",
                       quantize=choice)
    assert seen == expected
