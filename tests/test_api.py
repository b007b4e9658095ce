"""Public API: package import, bad input, interruption, stats."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import specar
from specar.model_loaders.tiny import tiny_model
from support import PACKAGE as ROOT
from support.calls import generate_kwargs



@pytest.fixture(scope="module")
def mdl():
    return tiny_model(6, (3, 3), seed=4, row_end=True)


def test_backends_listed():
    out = subprocess.run([sys.executable, "-c", "import specar; print(specar.BACKENDS)"], capture_output=True,
                         text=True, check=True, cwd="/")
    for name in ("ar", "sjd", "scd", "sjd_pac"):
        assert repr(name) in out.stdout


def test_pack_imports_as_a_comfyui_custom_node_folder():
    # ComfyUI imports custom_nodes/<folder>/__init__.py under the folder's own name
    spec = importlib.util.spec_from_file_location("SpecAR_pack_under_test", os.path.join(ROOT, "__init__.py"),
                                                  submodule_search_locations=[ROOT])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        assert isinstance(mod.NODE_CLASS_MAPPINGS, dict)
        assert mod.WEB_DIRECTORY == "./web"
        assert mod.BACKENDS == specar.BACKENDS
    finally:
        for name in [n for n in sys.modules if n.startswith(spec.name)]:
            del sys.modules[name]


BAD = [
    (dict(backend="medusa"), "backend"),
    (dict(backend="sjd", window=0), "window"),
    (dict(backend="sjd", window=129), "window"),
    (dict(backend="sjd", window=2.5), "window"),
    (dict(backend="sjd", init="diagonal"), "init"),
    (dict(backend="ar", window=4), "window"),
    (dict(backend="scd", coupling="none"), "coupling"),
    (dict(backend="scd", coupling_strength=1.5), "coupling_strength"),
    (dict(backend="scd", coupling_strength=-0.1), "coupling_strength"),
    (dict(backend="sjd_pac", tree_width=0), "tree_width"),
    (dict(backend="sjd_pac", tree_width=7), "tree_width"),
    (dict(backend="sjd_pac", tree_depth=0), "tree_depth"),
    (dict(backend="sjd_pac", window=2, tree_depth=3), "tree_depth"),
    (dict(backend="sjd_pac", continuation="yes"), "continuation"),
    (dict(backend="sjd_pac", coupling_strength=0.5), "coupling_strength"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_k=7), "top_k"),
    (dict(temperature=-1.0), "temperature"),
    (dict(cfg_scale=float("nan")), "cfg_scale"),
    (dict(cfg_scale=float("inf")), "cfg_scale"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(seed=-1), "seed"),
    (dict(batch_size=0), "batch_size"),
    (dict(prompt=123), "prompt"),
    (dict(prompt=["a", "b"]), "prompt"),
    (dict(negative_prompt=5), "negative_prompt"),
]


@pytest.mark.parametrize("kwargs,name", BAD, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD)])
def test_bad_input_is_a_clear_value_error(mdl, kwargs, name):
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", "ok")
    with pytest.raises(ValueError, match=name) as err:
        specar.generate(mdl, prompt, **generate_kwargs(**kwargs))
    assert "must" in str(err.value) or "one of" in str(err.value) or "has no parameter" in str(err.value)


def test_model_argument_checked():
    with pytest.raises(ValueError, match="model"):
        specar.generate("demo-but-a-string", "prompt")


def test_window_longer_than_the_image_shrinks(mdl):
    res = specar.generate(mdl, "x", backend=specar.make_backend("sjd", window=128), seed=3)
    assert res.tokens.shape == (3, 3)
    assert 0 <= int(res.tokens.min()) and int(res.tokens.max()) < 6


def test_interrupt_stops_and_model_stays_usable(mdl):
    calls = []

    def interrupt():
        calls.append(1)
        return len(calls) >= 2

    with pytest.raises(specar.GenerationInterrupted):
        specar.generate(mdl, "stop me", backend="sjd", seed=5, interrupt=interrupt)
    a = specar.generate(mdl, "stop me", backend="sjd", seed=5)
    b = specar.generate(mdl, "stop me", backend="sjd", seed=5)
    assert torch.equal(a.tokens, b.tokens)


def test_progress_reports_committed_tokens(mdl):
    seen = []
    specar.generate(mdl, "p", backend="ar", seed=1, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (mdl.geometry.seq_len, mdl.geometry.seq_len)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_stats_are_consistent(mdl):
    geo = mdl.geometry
    for backend, params in (("ar", {}), ("sjd", dict(window=4)), ("scd", dict(window=4, coupling="gumbel")),
                            ("sjd_pac", dict(window=4, tree_depth=2, tree_width=3))):
        res = specar.generate(mdl, "stats", **generate_kwargs(backend=backend, **params), seed=2)
        st = res.stats
        assert st.image_tokens == 9 and st.forced_tokens == 3
        assert st.nfe == st.steps[0] and 1 <= st.nfe <= 8
        assert st.step_compression == pytest.approx(9 / (st.nfe + 1))
        # every position after the first up to the last image token is committed by exactly one
        # step (a trailing row end may be filled in without one)
        last_image = int(geo.image_positions().max())
        assert last_image <= sum(k * v for k, v in st.accepted_length_histogram.items()) <= geo.seq_len - 1
        steps_map = torch.tensor(st.accepted_at_step[0])
        assert steps_map[0, 0] == 0 and int(steps_map.max()) == st.nfe
        assert (steps_map.flatten().diff() >= 0).all()  # raster order is commit order
        d = json.loads(json.dumps(st.to_dict()))
        assert d["backend"] == backend and d["nfe"] == st.nfe
        if backend == "ar":
            assert st.step_compression == pytest.approx(1.0)


def test_batch_rows_are_independent_samples(mdl):
    res = specar.generate(mdl, "batch", backend="scd", seed=9, batch_size=16)
    assert res.tokens.shape == (16, 3, 3)
    assert len({tuple(t.flatten().tolist()) for t in res.tokens}) > 1
    assert len(res.stats.steps) == 16


def test_load_model_rejects_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="neither a built-in model"):
        specar.load_model("no-such-model")
    with pytest.raises(ValueError, match="no supported model family"):
        specar.load_model(str(tmp_path))


@pytest.mark.parametrize("batch", [1, 3])
def test_gumbel_noise_table_equals_hashing_each_step(mdl, monkeypatch, batch):
    """The per-generation Gumbel table is an optimisation only: without it (every step hashes
    its positions again) the same seed gives the same images and the same forward count."""
    from specar.samplers import randomness
    kw = dict(backend="scd", coupling="gumbel", window=8, seed=5, batch_size=batch)
    with_table = specar.generate(mdl, "x", **generate_kwargs(**kw))
    monkeypatch.setattr(randomness, "GUMBEL_TABLE_BYTES", 0)
    hashed = specar.generate(mdl, "x", **generate_kwargs(**kw))
    assert torch.equal(with_table.sequence, hashed.sequence)
    assert with_table.stats.nfe == hashed.stats.nfe


def test_a_tree_too_big_for_the_model_names_its_parameters():
    demo = specar.load_model("demo")
    with pytest.raises(ValueError, match=r"tree_width=64 needs \d+ draft slots .* allows at most \d+: lower window"):
        specar.generate(demo, "a red circle",
                        backend=specar.make_backend("sjd_pac", window=64, tree_width=64, tree_depth=3))


def test_a_validated_backend_config_is_taken_as_is():
    from specar.samplers.backends import make_backend
    m = tiny_model()
    config = make_backend("sjd", window=3)
    a = specar.generate(m, "hi", backend=config, seed=5, batch_size=4)
    b = specar.generate(m, "hi", backend=specar.make_backend("sjd", window=3), seed=5, batch_size=4)
    assert torch.equal(a.sequence, b.sequence) and a.stats.params == {"window": 3, "init": "sample_above", "restart_after": 0}


def test_generate_takes_at_most_12_parameters():
    """One way in: the backend, sampling and run options each one value (**removed, the migration message, counts)."""
    import inspect
    assert len(inspect.signature(specar.generate).parameters) <= 12


def test_a_removed_keyword_says_what_to_write_instead():
    """The keywords generate took before its sampling, run and backend values: a TypeError naming each and the
    spelling that replaces it, which runs as written."""
    m = tiny_model()
    with pytest.raises(TypeError) as err:
        specar.generate(m, "hi", backend="sjd", seed=5, cfg_scale=2.0, window=4, compile=False, preset="paper")
    message = str(err.value)
    assert message.startswith("generate() takes no cfg_scale=, window=, compile=, preset= any more: write ")
    spelled = message.split("write ", 1)[1].split(" (", 1)[0]
    assert spelled == ("sampling=dict(cfg_scale=2.0), options=RunOptions(compile=False), "
                       "backend=make_backend('sjd', window=4, preset='paper')")
    # what it says to write runs
    specar.generate(m, "hi", seed=5, sampling=dict(cfg_scale=2.0), options=specar.RunOptions(compile=False),
                    backend=specar.make_backend('sjd', window=4, preset='paper'))
    with pytest.raises(TypeError, match="generate.. has no parameter seeds; its parameters are: model, prompt, "):
        specar.generate(m, "hi", seeds=[1, 2])


def test_top_k_none_is_the_models_and_0_is_off(monkeypatch):
    """One spelling: generate's sampling top_k None (or left out) takes the model's recommended top-k, 0 means no top-k
    (every image token), k keeps k; the engine receives exactly that."""
    from specar.samplers import api as api_mod
    mdl = tiny_model(16, (2, 2), seed=3)
    monkeypatch.setattr(mdl, "default_sampling", {"cfg_scale": 1.0, "top_k": 5}, raising=False)
    seen = []
    real = api_mod.SpeculativeEngine

    class Recording(real):
        def __init__(self, model, backend, sampling, *a, **kw):
            seen.append(sampling.top_k)
            super().__init__(model, backend, sampling, *a, **kw)

    monkeypatch.setattr(api_mod, "SpeculativeEngine", Recording)
    for top_k in (None, 0, 3):
        specar.generate(mdl, "hi", backend="ar", sampling=dict(top_k=top_k))
    assert seen == [5, 0, 3]
    # the same settings as one typed value (the nodes' way): a None field is the model's, resolved alike
    from specar.samplers.target import SamplingParams
    for top_k in (None, 0, 3):
        specar.generate(mdl, "hi", backend="ar", sampling=SamplingParams(None, None, top_k, None))
    assert seen == [5, 0, 3] * 2
    with pytest.raises(ValueError, match=r"sampling must be a SamplingParams or a dict of its fields \(cfg_scale, "
                       r"temperature, top_k, top_p\), got \{'topk': 3\}"):
        specar.generate(mdl, "hi", backend="ar", sampling=dict(topk=3))
    with pytest.raises(ValueError, match=r"top_k must be an int in \[0, 16\] \(the image vocabulary; 0 = no top-k\)"):
        specar.generate(mdl, "hi", backend="ar", sampling=dict(top_k=17))
    with pytest.raises(ValueError, match=r"top_k must be an int >= 0 \(0 = no top-k\), got -1"):
        specar.generate(mdl, "hi", backend="ar", sampling=dict(top_k=-1))

