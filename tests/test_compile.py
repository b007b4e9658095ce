"""compile=True: the whole decode step (propose, forward, target, verify, commit, observe) through
torch.compile, one static graph per plan.

The compiled step must give the eager step's tokens for the same seed, in both verification modes
(the graph computes the same math and replays the eager step's random draws; a float reassociation
could in principle flip a sampling race, which these seeds do not hit), compile once per plan with
no graph break (fullgraph=True: no host read, no data-dependent shape in the step) and never
recompile across steps or generations.
"""
import pytest
import torch

import specar
from specar.samplers.compiled_step import shape_compiled as compiled_mod
from specar.model_loaders.tiny import tiny_model
from support.calls import generate_kwargs

# make test compiles AR's one shape; the two others (each a minute or more of compiling on a CPU with an empty cache)
# run in make test-long
CONFIGS = [
    ("ar", {}),  # one shape: the pending token
    # two plans (the chain, and chain + branches); rejection sampling: the step's draws replayed in the graph
    pytest.param("sjd_pac", dict(window=3, tree_depth=2, tree_width=2, reproducible=False), marks=pytest.mark.long),
    # per-row trees: the mask is built from a [B, N] parents tensor in the graph
    pytest.param("hawk", dict(node_budget=8), marks=pytest.mark.long),
]


@pytest.fixture(scope="module")
def models():
    kw = dict(vocab_size=16, grid=(4, 4), seed=5, row_end=True)
    return tiny_model(**kw), tiny_model(**kw)  # eager, compiled (same weights)


@pytest.mark.parametrize("backend,params", CONFIGS)
def test_compiled_tokens_match_eager_without_breaks_or_recompiles(models, backend, params):
    eager, comp = models
    kw = dict(backend=backend, seed=21, batch_size=3, cfg_scale=2.0, **params)
    want = specar.generate(eager, "a cat", **generate_kwargs(**kw))
    first = specar.generate(comp, "a cat", **generate_kwargs(compile=True, **kw))
    assert torch.equal(first.tokens, want.tokens)
    st = first.stats.compile
    assert st["eager_fallback"] == "" and st["graph_breaks"] == 0 and st["recompiles"] == 0
    compiles = st["compiles"]
    # the same shapes again, another seed and another prompt of the same padded length
    again = specar.generate(comp, "a dog", **generate_kwargs(compile=True, **{**kw, "seed": 22}))
    assert torch.equal(again.tokens, specar.generate(eager, "a dog", **generate_kwargs(**{**kw, "seed": 22})).tokens)
    st2 = again.stats.compile
    assert st2["recompiles"] == 0 and st2["graph_breaks"] == 0 and st2["graphs_reused"] >= 1
    # a plan's first step runs eager (it records the step's draws), so a plan the first run met once compiles
    # here; the same generation once more then compiles nothing: every graph it runs is reused
    third = specar.generate(comp, "a dog", **generate_kwargs(compile=True, **{**kw, "seed": 22}))
    assert torch.equal(third.tokens, again.tokens)
    st3 = third.stats.compile
    # the block is this generation's: nothing compiled, every graph it ran compiled by an earlier run
    assert st3["compiles"] == 0 and st3["compile_s"] == 0 and st3["recompiles"] == 0 and st3["graph_breaks"] == 0
    assert st3["graphs_reused"] == st3["graphs_used"] >= 1
    if backend in ("ar", "hawk"):  # one plan, compiled: no step eager (sjd_pac's tree plan runs once per generation
        assert st3["eager_steps"] == 0  # here, and a plan run once in a generation stays eager); planted: the first
        # step of each plan eager in every generation (a compiled set kept only for CUDA graphs) gave 1
    assert st3["model_total"]["compiles"] == st2["model_total"]["compiles"] >= compiles  # the model's, all configs


def test_a_compiler_failure_says_so_once_and_runs_eager(monkeypatch, capsys):
    mdl = tiny_model(vocab_size=8, grid=(2, 3), seed=1)

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled_mod.torch, "compile", lambda fn, **kw: broken)
    want = specar.generate(tiny_model(vocab_size=8, grid=(2, 3), seed=1), "x",
                           backend=specar.make_backend("sjd", window=2), seed=3)
    got = specar.generate(mdl, "x", backend=specar.make_backend("sjd", window=2), seed=3, options=dict(compile=True))
    assert torch.equal(got.tokens, want.tokens)
    assert "no C++ compiler found" in got.stats.compile["eager_fallback"]
    err = capsys.readouterr().err
    assert err.count("torch.compile of the decode step failed, running eager") == 1
    specar.generate(mdl, "x", backend=specar.make_backend("sjd", window=2), seed=4, options=dict(compile=True))
    assert "torch.compile" not in capsys.readouterr().err  # said once


def test_compile_must_be_a_bool():
    mdl = tiny_model(vocab_size=4, grid=(2, 2), seed=0)
    with pytest.raises(ValueError, match="compile must be True or False, got 'yes'"):
        specar.generate(mdl, "x", options=dict(compile="yes"))
