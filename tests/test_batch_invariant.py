"""Batch-invariant target forwards (model_loaders/precision/batch_invariant.py): "same image as AR" in half precision.

- inside the mode attention and every product give a query row the same bits whatever else the call holds,
  in bf16 and fp16; outside it the CPU's flash-attention kernel does not (planted: the check has power here);
  results keep the op's dtype and value
- a chain forward and 1-token forwards give bit-identical logits under the mode in every family (our Llama,
  LlamaGen, Lumina-mGPT 2.0, and the transformers adapters Chameleon, Emu3, Janus-Pro), in bf16: the mode runs
  through each adapter's ops (plain forwards of these tiny models seldom differ: the power is in the attention
  check above and the demo check below)
- every registered backend gives AR's tokens in bf16 (row ends, CFG, top-k, a batch, two seeds)
- the demo model in bf16, where plain forwards flip races: with the mode off sjd's image is not AR's
  (planted), with it (the default) sjd, scd and sjd_pac give AR's tokens
- the mode runs only where it is due (never in float32, never outside the same-image mode); the statistics
  name the guarantee per dtype and device
- (long) the compiled step in bf16 under the mode gives eager AR's tokens
"""
import contextlib
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F

import specar
from specar.model_loaders.precision import batch_invariant
from specar.model_loaders.precision.batch_invariant import BatchInvariant, SameImage
from specar.samplers.backends import BACKENDS
from specar.model_loaders.tiny import tiny_model
from support.calls import generate_kwargs

GUARANTEE, FLOAT32 = SameImage.BATCH_INVARIANT, SameImage.TESTED

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the tiny-model builders (--import-mode=importlib)

HALF = (torch.bfloat16, torch.float16)
DEMO_PROMPT = "a small yellow star on a noisy green background"


def _attention_by_query(q, k, v, mask):
    """Attention of every query at once and one query at a time: [R, H, T, hd] each."""
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    one = torch.cat([F.scaled_dot_product_attention(q[:, :, i:i + 1], k, v, attn_mask=mask[:, :, i:i + 1])
                     for i in range(q.shape[2])], 2)
    return full, one


def _attention_cases(dtype):
    """(q, k, v, mask) with 2 rows of different prefix lengths, the shapes of a decode step (head sizes 16 to 128,
    a cache of 100 or 300 slots, 5 or 17 queries). Head size 128 (a 7B model's) is where this CPU's plain float16
    kernel varies with the number of queries on an AVX-512 Xeon; on an AMD EPYC smaller heads did too."""
    g = torch.Generator().manual_seed(0)
    for hd in (16, 32, 64, 128):
        for S in (100, 300):
            for T in (5, 17):
                q, k, v = (torch.randn(2, 4, n, hd, generator=g).to(dtype) for n in (T, S, S))
                prefix = torch.tensor([S - T - 3, S // 2])
                mask = torch.arange(S)[None, None] < (prefix[:, None, None] + torch.arange(T)[None, :, None] + 1)
                yield q, k, v, mask[:, None]


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_attention_of_a_query_does_not_depend_on_the_others_under_the_mode(dtype):
    plain = invariant = 0
    for q, k, v, mask in _attention_cases(dtype):
        full, one = _attention_by_query(q, k, v, mask)
        plain += int((full != one).sum())
        with BatchInvariant():
            full_i, one_i = _attention_by_query(q, k, v, mask)
        invariant += int((full_i != one_i).sum())
        assert full_i.dtype == dtype and torch.allclose(full_i.float(), full.float(), rtol=2e-2, atol=2e-2)
    # planted: the plain kernel blocks its sums by the number of queries (a few values in a thousand differ on
    # this machine's CPU); if it ever stops doing that, this test has no power here and must say so
    assert plain > 0, "plain attention gave every query the same bits: this check has no power on this CPU"
    assert invariant == 0


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_products_and_reductions_of_a_row_do_not_depend_on_the_batch_under_the_mode(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(34, 192, generator=g).to(dtype)
    w = (torch.randn(576, 192, generator=g) / 14).to(dtype)
    ops = {
        "linear": lambda x: F.linear(x, w),
        "matmul": lambda x: x @ w.T,
        "einsum": lambda x: torch.einsum("md,nd->mn", x, w),
        "baddbmm": lambda x: torch.baddbmm(torch.ones(1, 1, 576, dtype=dtype), x[None], w.T[None])[0],
        "softmax_float32": lambda x: F.softmax(x, -1, dtype=torch.float32),
        "sum_float64": lambda x: x.sum(-1, dtype=torch.float64),
        "rms": lambda x: x.float().pow(2).mean(-1, keepdim=True).rsqrt(),
        "layer_norm": lambda x: F.layer_norm(x, (192,)),
        "silu": F.silu,
    }
    for name, op in ops.items():
        native = op(x)
        with BatchInvariant():
            batch = op(x)
            rows = torch.cat([op(x[i:i + 1]) for i in range(len(x))])
        assert torch.equal(batch, rows), name
        assert batch.dtype == native.dtype, name  # the op's own result dtype
        assert torch.allclose(batch.float(), native.float(), rtol=2e-2, atol=2e-2), name


def _bf16(model):
    model.torch_module().to(torch.bfloat16)
    return model


def _chain_and_steps(model, prompt, T=9, prefix=5, seed=0):
    """Logits [2, T, V] (cond, uncond) of T tokens after `prefix` committed ones: one chain forward, and one
    forward per token."""
    tokens = torch.randint(0, model.geometry.vocab_size, (1, prefix + T), generator=torch.Generator().manual_seed(seed))
    out = []
    for chunk in (T, 1):
        session = model.start(prompt, 1, True, draft_capacity=T + 1)
        logits, i = [], 0
        while i < prefix + T:
            n = chunk if i >= prefix else 1
            o = model.forward(session, tokens[:, i:i + n], list(range(-1, n - 1)))
            logits.append(torch.stack([o.cond, o.uncond]))
            model.commit(session, torch.arange(n)[None], torch.tensor([n]))
            i += n
        out.append(torch.cat(logits, 2)[:, :, prefix:])
    return out


def _family(name, tmp_path):
    if name == "llama":
        return _bf16(tiny_model(64, (3, 3), row_end=True, hidden_size=64, num_heads=4)), "a red star"
    if name == "llamagen":
        from test_llamagen import HEADS, gpt_state, vq_state
        torch.save({"model": gpt_state("c2i")}, tmp_path / "c2i_tiny_64.pt")
        torch.save({"model": vq_state()}, tmp_path / "vq_ds16_c2i.pt")
        return specar.load_model(str(tmp_path), n_head=HEADS, dtype="bfloat16"), "3"
    if name == "lumina2":
        from test_lumina2 import WIDE, build
        build(str(tmp_path / "Lumina-mGPT-2.0-tiny"))
        return specar.load_model(str(tmp_path / "Lumina-mGPT-2.0-tiny"), dtype="bfloat16", **WIDE), "a red cat"
    if name == "chameleon":
        from test_chameleon import WIDE, build_tiny_chameleon
        build_tiny_chameleon(str(tmp_path / "Lumina-mGPT-tiny"))
        return specar.load_model(str(tmp_path / "Lumina-mGPT-tiny"), dtype="bfloat16", **WIDE), "a red cat"
    if name == "emu3":
        from test_emu3 import GRID_3X2, build_tiny_emu3
        build_tiny_emu3(str(tmp_path / "Emu3-Gen-tiny"))
        return specar.load_model(str(tmp_path / "Emu3-Gen-tiny"), dtype="bfloat16", **GRID_3X2), "a red cat"
    from test_janus import build_tiny_janus
    build_tiny_janus(str(tmp_path / "Janus-Pro-tiny"))
    return specar.load_model(str(tmp_path / "Janus-Pro-tiny"), dtype="bfloat16"), "a red cat"


@pytest.mark.parametrize("name", ["llama", "llamagen", "lumina2", "chameleon", "emu3", "janus"])
def test_every_family_gives_a_position_the_same_logits_in_any_forward_under_the_mode(name, tmp_path):
    model, text = _family(name, tmp_path)
    assert batch_invariant.target_forward_mode(model, True)[1] == GUARANTEE  # found half precision through torch_module
    prompt = model.encode_prompt(text, "blurry" if name != "llamagen" else "")
    with torch.inference_mode(), BatchInvariant():
        chain, steps = _chain_and_steps(model, prompt)
    assert torch.equal(chain, steps)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_gives_ars_tokens_in_bf16(backend):
    model = _bf16(tiny_model(16, (4, 5), seed=3, row_end=True))
    for seed in (0, 1):
        kw = dict(seed=seed, batch_size=4, cfg_scale=2.0, temperature=0.9, top_k=6)
        want = specar.generate(model, "hi", **generate_kwargs(backend="ar", **kw))
        got = specar.generate(model, "hi", **generate_kwargs(backend=backend, **kw))
        assert got.stats.same_image_guarantee == GUARANTEE
        assert torch.equal(got.sequence, want.sequence), (backend, seed)


@pytest.fixture(scope="module")
def demo_bf16():
    return specar.load_model("demo", dtype="bfloat16")


def test_demo_in_bf16_gives_ars_image_only_with_the_mode(demo_bf16, monkeypatch):
    ar = specar.generate(demo_bf16, DEMO_PROMPT, backend="ar", seed=0).tokens
    for backend in ("sjd", "scd", "sjd_pac"):
        got = specar.generate(demo_bf16, DEMO_PROMPT, backend=backend, seed=0)
        assert got.stats.same_image_guarantee == GUARANTEE
        assert torch.equal(got.tokens, ar), backend
    # planted: the same runs with plain bf16 forwards (a 1-token forward and a chain round differently)
    monkeypatch.setattr(batch_invariant, "target_forward_mode",
                        lambda model, reproducible, pin_width=None: (contextlib.nullcontext, None, None))
    plain_ar = specar.generate(demo_bf16, DEMO_PROMPT, backend="ar", seed=0).tokens
    plain_sjd = specar.generate(demo_bf16, DEMO_PROMPT, backend="sjd", seed=0).tokens
    assert not torch.equal(plain_sjd, plain_ar), "plain bf16 gave AR's image: the check above has no power here"


def test_the_mode_runs_only_for_half_precision_in_the_same_image_mode(monkeypatch):
    def entered(*args, **kwargs):
        raise AssertionError("the batch-invariant mode ran")

    monkeypatch.setattr(BatchInvariant, "__torch_function__", entered)
    fp32 = tiny_model(16, (2, 3), row_end=True)
    r = specar.generate(fp32, "hi", backend="sjd", seed=0, sampling=dict(cfg_scale=2.0))
    assert r.stats.same_image_guarantee == FLOAT32 and r.stats.to_dict()["same_image_guarantee"] == "tested"
    assert json.loads(json.dumps(r.stats.to_dict()))["same_image_reason"] == "float32: tested on the CPU, not proven"
    bf16 = _bf16(tiny_model(16, (2, 3), row_end=True))
    assert specar.generate(bf16, "hi", backend="sjd", seed=0,
                           options=dict(reproducible=False)).stats.same_image_guarantee is None
    with pytest.raises(AssertionError, match="mode ran"):
        specar.generate(bf16, "hi", backend="sjd", seed=0)


def test_the_guarantee_names_dtype_and_device(monkeypatch):
    def stub(dtype, device):
        module = torch.nn.Linear(2, 2).to(dtype)
        return types.SimpleNamespace(device=torch.device(device), torch_module=lambda: module)

    SameImage = batch_invariant.SameImage
    assert {g.value for g in SameImage} == {"batch_invariant", "shape_pinned", "tested", "not_guaranteed"}
    assert batch_invariant.target_forward_mode(stub(torch.bfloat16, "cpu"), True)[:2] == (BatchInvariant, GUARANTEE)
    assert batch_invariant.target_forward_mode(stub(torch.bfloat16, "cpu"), False) == (contextlib.nullcontext, None, None)
    hidden = types.SimpleNamespace(device=torch.device("cpu"),
                                   torch_module=lambda: specar.ARImageModel.torch_module(hidden))  # raises
    assert batch_invariant.target_forward_mode(hidden, True)[1:] == (SameImage.NOT_GUARANTEED, "the model's dtype is unknown")
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        mode, guarantee, why = batch_invariant.target_forward_mode(stub(dtype, "cuda"), True)
        assert mode is contextlib.nullcontext and guarantee is SameImage.NOT_GUARANTEED
        assert why.startswith(f"{name} on cuda")
    monkeypatch.setattr(torch.backends.cuda, "matmul", types.SimpleNamespace(allow_tf32=False))
    assert batch_invariant.target_forward_mode(stub(torch.float32, "cuda"), True)[:2] == (contextlib.nullcontext, FLOAT32)
    monkeypatch.setattr(torch.backends.cuda, "matmul", types.SimpleNamespace(allow_tf32=True))
    _, guarantee, why = batch_invariant.target_forward_mode(stub(torch.float32, "cuda"), True)
    assert guarantee is SameImage.NOT_GUARANTEED and why.startswith("float32 products in TF32")


@pytest.mark.long
def test_compiled_step_in_bf16_gives_eager_ars_tokens():
    # inductor keeps bf16 intermediates in float32 unless told to round as eager does (emulate_precision_casts,
    # samplers/compiled_step/shape_compiled.py): without it this run differs from AR in 2 tokens
    model = _bf16(tiny_model(16, (4, 4), row_end=True, hidden_size=32, num_heads=2))
    kw = dict(seed=1, cfg_scale=3.0)
    want = specar.generate(model, "a red star", **generate_kwargs(backend="ar", **kw))
    for _ in range(2):  # the first compiles the step's graph, the second runs it
        got = specar.generate(model, "a red star", **generate_kwargs(backend="sjd", compile=True, **kw))
    assert got.stats.compile["graphs_used"] and not got.stats.compile["eager_fallback"]
    assert torch.equal(got.sequence, want.sequence)


def test_the_node_summary_says_when_the_same_image_is_not_guaranteed():
    """The sampler node's notes name a not_guaranteed run (planted: the note removed, or keyed on the old prose)."""
    import dataclasses

    from specar.nodes import report
    from specar.model_loaders.tiny import tiny_model
    stats = specar.generate(tiny_model(8, (2, 2), seed=0), "hi", backend="sjd", seed=0).stats
    assert stats.same_image_guarantee == "tested"
    assert not any("not guaranteed" in n for n in report.summary(stats, None)[1])
    gpu = dataclasses.replace(stats, same_image_guarantee="not_guaranteed", same_image_reason="bfloat16 on cuda")
    assert any("not guaranteed here (bfloat16 on cuda)" in n for n in report.summary(gpu, None)[1])
