"""The compiled CPU step's products of a few rows as a multiply-and-sum (samplers/compiled_step/few_rows_matmul.py).

The rewrite must compute the same product (to float32 rounding), must apply only up to its row
limit (wider products keep BLAS), and a compiled AR generation that goes through it must give
the eager generation's tokens.
"""
import pytest
import torch
import torch.nn.functional as F

import specar
from specar.samplers.compiled_step.few_rows_matmul import MAX_ROWS, few_rows_pass
from specar.samplers.compiled_step.shape_compiled import compile_settings
from specar.samplers.compiled_step.step_graphs import compile_stats
from specar.model_loaders.tiny import tiny_model
from support.calls import generate_kwargs

pytestmark = pytest.mark.skipif(few_rows_pass() is None, reason="this torch has no inductor custom-pass API")


def _gemm_calls(fn, *args):
    """(output, number of BLAS products in the generated code) of a fresh compile of fn."""
    from torch._inductor.utils import fresh_cache, run_and_get_code
    torch._dynamo.reset()
    with fresh_cache():
        out, code = run_and_get_code(fn, *args)
    text = "\n".join(code)
    return out, text.count("mm_out(") + text.count("extern_kernels.mm(") + text.count("extern_kernels.addmm(")


def _linears(x, w1, w2, b2):
    return F.linear(F.silu(F.linear(x, w1)), w2, b2)  # mm, then addmm (with bias), a pointwise op between


@pytest.mark.parametrize("rows", [1, 2, MAX_ROWS])
def test_few_rows_become_one_reduction_with_the_same_product(rows):
    g = torch.Generator().manual_seed(rows)
    x, w1, w2, b2 = (torch.randn(*s, generator=g) for s in ((rows, 48), (80, 48), (24, 80), (24,)))
    fn = torch.compile(_linears, fullgraph=True, dynamic=False, **compile_settings("cpu"))
    out, gemms = _gemm_calls(fn, x, w1, w2, b2)
    assert gemms == 0
    torch.testing.assert_close(out, _linears(x, w1, w2, b2), rtol=1e-4, atol=1e-4)


def test_products_above_the_limit_keep_blas():
    x = torch.randn(MAX_ROWS + 1, 48)
    w1, w2, b2 = torch.randn(80, 48), torch.randn(24, 80), torch.randn(24)
    fn = torch.compile(_linears, fullgraph=True, dynamic=False, **compile_settings("cpu"))
    out, gemms = _gemm_calls(fn, x, w1, w2, b2)
    assert gemms == 2
    torch.testing.assert_close(out, _linears(x, w1, w2, b2), rtol=1e-4, atol=1e-4)


def test_limit_zero_is_no_rewrite():
    assert few_rows_pass(0) is None
    assert "post_grad_custom_pre_pass" not in compile_settings("cpu", few_rows=0)["options"]
    assert "post_grad_custom_pre_pass" in compile_settings("cpu")["options"]


@pytest.mark.long
def test_compiled_ar_through_the_rewrite_gives_eager_tokens():
    """Batch 1 with CFG: AR's forward is 2 rows (the rewrite applies), the sjd chain's 2 x 3 = 6. (make test-long: in
    make test, tests/test_compile.py's AR at batch 3 with CFG, 6 rows, and the transformers family below go through
    the rewrite.)"""
    kw = dict(vocab_size=16, grid=(4, 4), seed=7)
    eager, comp = tiny_model(**kw), tiny_model(**kw)
    for backend, params in (("ar", {}), ("sjd", dict(window=2))):
        for seed in (3, 4):
            args = dict(backend=backend, seed=seed, cfg_scale=2.0, **params)
            want = specar.generate(eager, "a cat", **generate_kwargs(**args))
            got = specar.generate(comp, "a cat", **generate_kwargs(compile=True, **args))
            assert torch.equal(got.tokens, want.tokens), (backend, seed)
    assert compile_stats(comp).eager_fallback == "" and compile_stats(comp).recompiles == 0


def test_a_transformers_family_compiles_through_the_rewrite_with_eager_tokens(tmp_path):
    """The transformers adapters' step (Chameleon's decoder layers, nn.Linear on [R, T, D]) goes
    through the same pass: AR at batch 1 with CFG is 2 rows per product."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the tiny-model builders
    from test_chameleon import build_tiny_chameleon
    folder = str(tmp_path / "chameleon")
    build_tiny_chameleon(folder)
    eager, comp = specar.load_model(folder), specar.load_model(folder)
    args = dict(backend="ar", seed=3, cfg_scale=2.0)
    got = specar.generate(comp, "a cat", **generate_kwargs(compile=True, **args))
    assert torch.equal(got.tokens, specar.generate(eager, "a cat", **generate_kwargs(**args)).tokens)
    st = got.stats.compile
    assert st["eager_fallback"] == "" and st["graph_breaks"] == 0 and st["recompiles"] == 0
