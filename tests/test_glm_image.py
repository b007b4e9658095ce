"""GLM-Image adapter on a tiny random-weight `GlmImageForConditionalGeneration` and `GlmImageProcessor` saved in
the released layout (vision_language_encoder/, processor/; model_index.json and the DiT where diffusers is
installed) and loaded by `specar.load_model`.

Checks: the prompt carries the processor's grid sizes; `ar` on the two stages reproduces transformers' own
`generate` over both grids token for token (greedy: the M-RoPE grid positions); every backend gives AR's tokens on
both grids (same image as AR); one `specar.generate` spans both grids (stats, progress, interrupt); the loader and
sampler nodes on the folder, every lossless backend as AR; the adapter conformance suite on both stages; sizes; the
missing-extra message; the DiT decode through diffusers (skipped without diffusers).
"""
import json
import os
import shutil
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "GlmImageForConditionalGeneration"):
    pytest.skip("this transformers has no GLM-Image", allow_module_level=True)

import specar
from specar.model_loaders.families import glm_image
from support import tiny_glm_image
from support.exactness import mark_long
from support.calls import generate_kwargs

CODES = 8
PROMPT = "a red cat"
SIZE = "64x96"  # W x H pixels: a 3x2 target grid, and the processor's 19x13 preview grid
TOL = 1e-5


# the tiny folder's builder: a plain module (no pytest, no specar), which tooling/ui_check.js also runs with
# ComfyUI's Python
build_tiny_glm_image = tiny_glm_image.build_tiny_glm_image
assert tiny_glm_image.CODES == CODES


def build_tiny_dit(root, hf, proc, seed=0):
    """The DiT, VAE, glyph encoder and scheduler with diffusers' GlmImagePipeline.save_pretrained: the whole
    released layout (model_index.json) under `root`."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    C = 4
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=C, block_out_channels=(8, 8, 8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=1, norm_num_groups=4, latents_mean=[0.0] * C, latents_std=[1.0] * C)
    glyphs = T5EncoderModel(T5Config(vocab_size=384, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    dit = GlmImageTransformer2DModel(patch_size=2, in_channels=C, out_channels=C, num_layers=1, attention_head_dim=8,
                                     num_attention_heads=2, text_embed_dim=16, time_embed_dim=16, condition_dim=8,
                                     prior_vq_quantizer_codebook_size=CODES)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.25, max_shift=0.75)
    GlmImagePipeline(tokenizer=ByT5Tokenizer(), processor=proc, text_encoder=glyphs, vision_language_encoder=hf,
                     vae=vae, transformer=dit, scheduler=scheduler).save_pretrained(root)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("glm") / "GLM-Image-tiny")
    hf, proc = build_tiny_glm_image(root)
    ar = os.path.join(root, "vision_language_encoder")
    return root, hf, proc, specar.load_model(ar, resolution=SIZE)


@pytest.fixture(scope="module")
def mdl(tiny):
    return tiny[3]


def test_layout_sizes_and_defaults(tiny):
    root, hf, proc, mdl = tiny
    assert (mdl.geometry.height, mdl.geometry.width, mdl.geometry.vocab_size) == (3, 2, CODES)
    pv = mdl.preceding_stage()
    assert (pv.geometry.height, pv.geometry.width) == (19, 13) and pv.geometry.row_end is False
    ids = pv.encode_prompt(PROMPT).cond
    assert proc.tokenizer.decode(ids[-9:]).replace(" ", "") == "<sop>32<eop><sop>1913<eop><|dit_token_8|>"
    assert glm_image.grids(1024, 1024) == ((32, 32), (16, 16))
    # one object per stage (its compiled steps); the preview stage is the first: nothing precedes it
    assert mdl.preceding_stage() is pv and pv._as_stage("target") is mdl and pv.preceding_stage() is None
    # generation_config.json, no AR CFG
    assert mdl.default_sampling == {"cfg_scale": 1.0, "top_k": CODES, "temperature": 0.9, "top_p": 0.75}
    assert specar.model_loaders.registry.family_of(os.path.join(root, "vision_language_encoder")).name == "glm_image"


def test_ar_reproduces_transformers_generate_over_both_grids(tiny):
    """Greedy: transformers' generate (its cached M-RoPE decode positions) over the preview then the target grid."""
    root, hf, proc, mdl = tiny
    messages = [[{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]]
    inputs = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                      processor_kwargs=dict(target_h=96, target_w=64))
    n = mdl.preceding_stage().geometry.num_image_tokens + mdl.geometry.num_image_tokens
    out = hf.generate(**inputs, max_new_tokens=n, do_sample=False, suppress_tokens=[CODES, CODES + 1])
    ref = out[0, inputs["input_ids"].shape[1]:]
    res = specar.generate(mdl, PROMPT, backend="ar", sampling=dict(temperature=0))
    ours = torch.cat([res.preceding.tokens.flatten(), res.tokens.flatten()])
    assert ours.tolist() == ref.tolist()
    assert len(set(ref.tolist())) > 2  # the tiny model's greedy path is not one repeated code


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_same_image_as_ar_on_both_grids(mdl, backend, monkeypatch):
    monkeypatch.setattr(mdl, "random_drafter_seed", 0, raising=False)  # hawk / adt_tree: random-weight drafters
    ar = specar.generate(mdl, PROMPT, backend="ar", seed=11, batch_size=2)
    res = specar.generate(mdl, PROMPT, backend=backend, seed=11, batch_size=2)
    assert res.preceding.tokens.shape == (2, 19, 13) and res.tokens.shape == (2, 3, 2)
    assert torch.equal(res.preceding.tokens, ar.preceding.tokens)
    assert torch.equal(res.tokens, ar.tokens)


def test_one_generate_spans_both_grids(mdl):
    """specar.generate on the two-grid model: stats over both grids (AR compresses exactly 1.0: each target prefill
    yields a token), one progress bar over both, the interrupt honoured in either grid, the model usable after."""
    n_prev, n = mdl.preceding_stage().geometry.num_image_tokens, mdl.geometry.num_image_tokens
    seen = []
    ar = specar.generate(mdl, PROMPT, backend="ar", seed=4, batch_size=2, progress=lambda d, t: seen.append((d, t)))
    st = ar.stats
    assert (st.batch, st.image_tokens, st.steps) == (2, n_prev + n, [n_prev + n - 1] * 2)
    assert st.nfe == n_prev - 1 + 2 * n and st.step_compression == pytest.approx(1.0)
    assert st.accepted_length_histogram == {1: 2 * (n_prev - 1) + 2 * (n - 1)} and st.mean_accepted_length == 1.0
    assert torch.tensor(st.accepted_at_step).shape == (2, 3, 2)  # the image's grid (the heatmap's)
    assert st.latency_s == pytest.approx(st.prefill_s + st.decode_s) and st.latency_s > ar.preceding.stats.latency_s
    assert seen[-1] == (2 * (n_prev + n),) * 2 and {t for _, t in seen} == {2 * (n_prev + n)}
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and any(2 * n_prev < d < seen[-1][0] for d, _ in seen)

    res = specar.generate(mdl, PROMPT, backend="sjd", seed=4, batch_size=2)
    first, st = res.preceding.stats, res.stats
    target_steps = [s - p - 1 for s, p in zip(st.steps, first.steps)]  # each image's target run, its prefill apart
    assert min(target_steps) >= 0 and st.nfe == first.nfe + sum(s + 1 for s in target_steps)
    assert st.step_compression == pytest.approx(sum((n_prev + n) / (s + 1) for s in st.steps) / 2)
    assert torch.equal(res.tokens, ar.tokens)

    for stop_after in (1, n_prev + 2):  # AR checks once per forward: in the preview grid, then in the target's
        calls, seen = [], []
        with pytest.raises(specar.GenerationInterrupted):
            specar.generate(mdl, PROMPT, backend="ar", seed=4, progress=lambda d, t: seen.append(d),
                            interrupt=lambda: calls.append(1) or len(calls) >= stop_after)
        assert (seen[-1] > n_prev) == (stop_after > n_prev)
    assert torch.equal(specar.generate(mdl, PROMPT, backend="ar", seed=4, batch_size=2).tokens, ar.tokens)


def test_the_sampler_node_runs_every_backend_as_ar(tiny, comfy, monkeypatch):
    """The released layout in ComfyUI's models/specar/: listed and loaded by the loader node at a listed size, and
    every lossless backend through the sampler node (same image as AR on) gives AR's tokens."""
    from specar.model_loaders import registry
    from specar.nodes import models
    from support.node_harness import execute, node_classes, run_sampler_node, sampler_values
    folder = os.path.join(comfy["models_dir"], "specar", "GLM-Image-tiny")
    shutil.copytree(tiny[0], folder)
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump({"_class_name": "GlmImagePipeline"}, f)
    real = glm_image.importlib.util.find_spec  # no DiT files here: the node shows the codes
    monkeypatch.setattr(glm_image.importlib.util, "find_spec", lambda n, *a: None if n == "diffusers" else real(n, *a))
    monkeypatch.setattr(models, "load_model", registry.load_model)  # the real loader, not the fixture's stand-in
    classes = node_classes("v1")
    assert "GLM-Image-tiny" in models.model_choices()
    allowed = models.allowed_values("GLM-Image-tiny")["resolution"]
    assert {"256x256", "1536x1536", "2048x2048", "2048x1152", "1152x2048"} <= set(allowed) and "720x720" not in allowed
    assert "multiples of 32" in models.loader_error("GLM-Image-tiny", "720x720")  # at queue time, per model
    assert "2048x2048" in models.loader_error("demo", "2048x2048")
    handle, = execute(classes["SpecARModelLoader"], model="GLM-Image-tiny", device="cpu", dtype="auto",
                      resolution="256x256")[0]
    m = models.resolve(handle)
    assert m.family == "glm_image" and (m.geometry.height, m.geometry.width) == (8, 8)
    monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)  # hawk / adt_tree: random-weight drafters
    n = m.preceding_stage().geometry.num_image_tokens + m.geometry.num_image_tokens

    def run(backend):
        comfy["progress"].clear()
        (image, tokens, stats, _), _ = run_sampler_node(classes["SpecARSampler"], handle, sampler_values(
            prompt=PROMPT, seed=5, backend=backend, same_image_as_ar=True))
        assert comfy["progress"][-1] == (n, n), backend  # one bar over both grids
        return tokens["tokens"], json.loads(stats), image

    ar, stats, image = run("ar")
    # no decoder: the codes in their preview colours, 32 px a code (256x256)
    assert ar.shape == (1, 8, 8) and image.shape == (1, 256, 256, 3)
    codes = pil_to_tensor_of(m.decode_preview(ar))[0]
    assert torch.equal(image[0, ::32, ::32], codes) and not torch.equal(image[..., 0], image[..., 1])
    assert stats["image_tokens"] == n and stats["step_compression"] == pytest.approx(1.0)
    # the widgets' defaults (guidance and sampling "model default") sample at the checkpoint's settings, shown after
    assert {k: stats["sampling"][k] for k in ("temperature", "top_p", "top_k", "cfg_scale")} == \
        {"temperature": 0.9, "top_p": 0.75, "top_k": CODES, "cfg_scale": 1.0}
    for sampling in ("custom", None):  # None: a workflow saved before the sampling switch, its explicit values
        values = sampler_values(prompt=PROMPT, seed=5, backend="ar", sampling=sampling, temperature=1.0, top_p=1.0)
        (_, _, explicit, _), _ = run_sampler_node(classes["SpecARSampler"], handle,
                                                  {k: v for k, v in values.items() if v is not None})
        ran = json.loads(explicit)["sampling"]
        assert (ran["temperature"], ran["top_p"]) == (1.0, 1.0), sampling
    for backend in specar.BACKENDS[1:]:
        tokens, stats, _ = run(backend)
        assert torch.equal(tokens, ar), backend
        assert stats["backend"] == backend and stats["reproducible"]


@pytest.mark.parametrize("stage", ["preview", "target"])
@pytest.mark.parametrize("cfg", [False, True])
def test_adapter_conformance(mdl, stage, cfg, monkeypatch):
    from support.conformance import (check_commit_path, check_hidden_states, check_per_row_trees,
                                                  check_tree_forward)
    model = mdl.preceding_stage() if stage == "preview" else mdl._as_stage("target")
    if stage == "target":  # the target stage's prompt ends with a preview grid (the text layout, then its codes)
        preview = torch.arange(model.geometries["preview"].num_image_tokens) % CODES
        monkeypatch.setattr(model, "encode_prompt", lambda t, n="": model.prompt_after(t, preview, n))
    for check in (check_tree_forward, check_per_row_trees, check_commit_path, check_hidden_states):
        check(model, cfg, TOL)


def test_sizes_and_stage_errors(tiny, mdl):
    ar = os.path.join(tiny[0], "vision_language_encoder")
    for bad in ("70x96", "4096x1024", "0x64"):
        with pytest.raises(ValueError, match="multiples of 32"):
            specar.load_model(ar, resolution=bad)
    with pytest.raises(ValueError, match=r"specar.generate\(model, text\) generates both"):
        mdl.encode_prompt(PROMPT)
    with pytest.raises(ValueError, match="19x13 preview grid"):
        mdl.prompt_after(PROMPT, torch.zeros(5, dtype=torch.long))


def test_a_processor_that_ignores_the_size_is_caught(mdl, monkeypatch):
    proc = mdl.processor
    original = type(proc).apply_chat_template
    monkeypatch.setattr(proc, "apply_chat_template",  # its default size (768x1152) instead of the one asked
                        lambda messages, processor_kwargs=None, **kw: original(proc, messages, **kw))
    with pytest.raises(ValueError, match="did not build the 64x96 layout"):
        mdl.preceding_stage().encode_prompt(PROMPT)


def test_int8_weights_generate_both_grids(tiny):
    from specar.model_loaders.precision.quantize import QuantLinear
    m = specar.load_model(os.path.join(tiny[0], "vision_language_encoder"), resolution=SIZE, quantize="int8")
    assert isinstance(m.backbone.layers[0].mlp.gate_up_proj, QuantLinear)
    ar = specar.generate(m, PROMPT, backend="ar", seed=2)
    res = specar.generate(m, PROMPT, backend="sjd", seed=2)
    assert torch.equal(res.tokens, ar.tokens) and res.tokens.shape == (3, 2)


def test_missing_diffusers_is_one_line_and_tokens_still_come(tiny, tmp_path, monkeypatch):
    root = tmp_path / "GLM-Image"
    shutil.copytree(os.path.join(tiny[0], "vision_language_encoder"), root / "vision_language_encoder")
    shutil.copytree(os.path.join(tiny[0], "processor"), root / "processor")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "GlmImagePipeline"}))
    (root / "transformer").mkdir()  # the DiT's parts (unread without diffusers): installing diffusers would help
    real = glm_image.importlib.util.find_spec
    monkeypatch.setattr(glm_image.importlib.util, "find_spec", lambda n, *a: None if n == "diffusers" else real(n, *a))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = specar.load_model(str(root), resolution=SIZE)  # the released layout's root, found by model_index.json
    said = [str(w.message) for w in caught if "diffusers" in str(w.message)]
    assert said == [glm_image.MISSING_DIFFUSERS] and "\n" not in said[0]
    assert os.path.isfile(glm_image.REQUIREMENTS) and glm_image.REQUIREMENTS in said[0]
    assert m.decoder_problem == glm_image.MISSING_DIFFUSERS
    res = specar.generate(m, PROMPT, backend="sjd", seed=3)
    assert res.image is None and res.tokens.shape == (3, 2)
    monkeypatch.setitem(__import__("sys").modules, "diffusers", None)  # import diffusers -> ImportError
    with pytest.raises(ImportError, match="requirements-glm-image.txt"):
        m.dit_pipeline()


def test_without_the_dit_the_folder_and_its_ar_folder_load_tokens_only_where_diffusers_is(tiny, tmp_path, monkeypatch):
    """docs/NODES.md: the released layout with none of the DiT's parts (the tiny ComfyUI folder), and its
    vision_language_encoder/ alone, load tokens only where diffusers is installed, saying so (planted: the DiT's 8
    files were required whenever diffusers was there); a folder with part of the DiT is refused naming what it lacks."""
    root = tmp_path / "GLM-Image"
    shutil.copytree(os.path.join(tiny[0], "vision_language_encoder"), root / "vision_language_encoder")
    shutil.copytree(os.path.join(tiny[0], "processor"), root / "processor")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "GlmImagePipeline"}))
    real = glm_image.importlib.util.find_spec
    monkeypatch.setattr(glm_image.importlib.util, "find_spec", lambda n, *a: object() if n == "diffusers" else real(n, *a))
    for folder in (root, root / "vision_language_encoder"):
        m = specar.load_model(str(folder), resolution=SIZE)
        assert m.decoder_problem.startswith("no DiT in") and "tokens only" in m.decoder_problem, m.decoder_problem
        assert specar.generate(m, PROMPT, backend="sjd", seed=3).image is None
    (root / "transformer").mkdir()
    with pytest.raises(ValueError, match=r"missing 8 files: transformer/config.json"):
        specar.load_model(str(root), resolution=SIZE)


def test_dit_decodes_through_diffusers(tiny, tmp_path):
    pytest.importorskip("diffusers", reason="the glm-image extra (diffusers) is not installed: no DiT to decode with")
    full = str(tmp_path / "GLM-Image-full")
    build_tiny_dit(full, *build_tiny_glm_image(full))
    m = specar.load_model(full, resolution=SIZE, dit_steps=2)
    assert m.decoder_problem is None
    res = specar.generate(m, "a sign 'no'", backend="sjd", seed=1)
    assert res.image.size == (64, 96) and res.preceding.image is None
    other = specar.generate(m, "a red cat", backend="sjd", seed=1)  # another prompt in between
    # the DiT's noise follows the codes, its glyphs the prompt the result carries (not the model's last prompt)
    again = m.decode_tokens(res.tokens[None], prompt=res.prompt)[0]
    assert again.tobytes() == res.image.tobytes() and res.prompt.text == "a sign 'no'"
    assert m.decode_tokens(res.tokens[None], prompt=other.prompt)[0].tobytes() != res.image.tobytes()
    with pytest.raises(ValueError, match="prompt=result.prompt"):
        m.decode_tokens(res.tokens[None])
    with pytest.raises(ValueError, match="dit_steps"):
        specar.load_model(full, resolution=SIZE, dit_steps=0)


# the exactness suite's cases on the target stage (a 1x2 grid after a fixed 11x22 preview: 64 images to enumerate;
# the preview grid itself, ~16x16 by the processor's rule, is too large to enumerate); reproducible=False: each
# backend's own rejection sampling, the mode where only the distribution ties it to AR
CHI_CASES = [("ar", {}), ("sjd", dict(window=3, init="random")),
             ("scd", dict(window=3, coupling="maximal")), ("sjd_pac", dict(window=3, tree_depth=2, tree_width=2)),
             ("auto", dict(max_window=2)), ("hawk", {}), ("adt_tree", {}), ("spatial", {})]  # random drafters


def _target_chi_square(tiny, backend, params, sampled=None):
    """chi-square of `backend`'s target-stage images against the exact distribution at `settings` (`sampled`: the
    settings the backend samples with, a planted mismatch when they differ)."""
    from support.exactness import chi_square_test, exact_distribution
    m = specar.load_model(os.path.join(tiny[0], "vision_language_encoder"), resolution="64x32")._as_stage("target")
    assert (m.geometry.height, m.geometry.width) == (1, 2)
    m.random_drafter_seed = 0  # hawk / adt_tree / spatial: random-weight drafters
    preview = torch.arange(m.geometries["preview"].num_image_tokens) % CODES
    prompt = m.prompt_after(PROMPT, preview)
    settings = dict(temperature=0.9, top_p=0.75)
    exact = exact_distribution(m, prompt, **settings)
    tokens = torch.cat([specar.generate(m, prompt,
                                        **generate_kwargs(backend=backend, reproducible=False, **(sampled or settings),
                                                          **params),
                                        seed=100 + i, batch_size=1000).tokens for i in range(4)])
    return chi_square_test(tokens, exact)


@pytest.mark.parametrize("case", mark_long(CHI_CASES, (1,)), ids=lambda c: c[0])
def test_target_stage_chi_square(tiny, case):
    assert set(specar.BACKENDS) <= {c[0] for c in CHI_CASES}, "a registered backend without its chi-square case"
    p, stat, dof, tv = _target_chi_square(tiny, *case)
    assert p > 1e-6, f"chi2={stat:.1f} dof={dof} p={p:.2e} TV={tv:.4f}"


def test_the_chi_square_catches_a_sampler_off_the_distribution(tiny):
    """Planted: sjd sampling at top-p 0.9 where the exact distribution is at top-p 0.75 fails the same test."""
    p, stat, dof, tv = _target_chi_square(tiny, "sjd", dict(window=3, init="random"), dict(temperature=0.9, top_p=0.9))
    assert p < 1e-6, f"a sampler off the distribution passed: chi2={stat:.1f} dof={dof} p={p:.2e} TV={tv:.4f}"


def test_nothing_of_diffusers_is_imported_until_an_image_is_decoded(tiny):
    """diffusers (the glm-image extra) is imported by GLM-Image's decode only: not by the package, another family,
    nor loading and sampling GLM-Image's AR folder (planted: the check sees an import of diffusers). Without the
    extra nothing can import diffusers, so the check could not fail: skipped."""
    pytest.importorskip("diffusers", reason="the glm-image extra (diffusers) is not installed: nothing to import")
    import subprocess
    import sys
    code = ("import sys, specar; m = specar.load_model(sys.argv[1], resolution=sys.argv[2]); "
            "specar.generate(specar.load_model('demo'), 'a red circle', backend='ar'); "
            "specar.generate(m, 'a cat', backend='sjd'); {plant}"
            "print(sorted(n for n in sys.modules if n.split('.')[0] == 'diffusers'))")
    for plant, want in (("", "[]"), ("import diffusers; ", "'diffusers'")):
        folder = os.path.join(tiny[0], "vision_language_encoder")
        out = subprocess.run([sys.executable, "-c", code.format(plant=plant), folder, SIZE], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        last = out.stdout.strip().splitlines()[-1]
        assert (last == want) if want == "[]" else (want in last), last


@pytest.fixture(scope="module")
def full_folder(tmp_path_factory):
    """The whole released layout (the DiT's parts saved by diffusers' GlmImagePipeline.save_pretrained)."""
    pytest.importorskip("diffusers", reason="the glm-image extra (diffusers) is not installed: no DiT parts to save")
    full = str(tmp_path_factory.mktemp("glm-full") / "GLM-Image-full")
    build_tiny_dit(full, *build_tiny_glm_image(full))
    return full


def test_every_file_the_loaders_read_is_checked(full_folder, tmp_path):
    """Each file of the released layout whose absence breaks loading or decoding (the ByT5 tokenizer's
    added_tokens.json does not) is named when it is missing (planted: a part left out of the check)."""
    from specar.model_loaders.families.glm_image_folder import missing_files
    assert missing_files(full_folder, decoder=True) == []
    files = sorted(os.path.relpath(os.path.join(d, f), full_folder) for d, _, fs in os.walk(full_folder) for f in fs)
    needed = [f for f in files if f not in ("model_index.json", "tokenizer/added_tokens.json")]
    assert len(needed) == 15
    for rel in needed:
        root = str(tmp_path / rel.replace("/", "_"))
        shutil.copytree(full_folder, root)
        os.remove(os.path.join(root, rel))
        said = [os.path.relpath(m, root) for m in missing_files(root, decoder=True)]
        assert len(said) == 1 and said[0].split(" ")[0] == rel, (rel, said)


def test_a_folder_missing_files_is_refused_naming_every_one(tiny, comfy, monkeypatch):
    """A GLM-Image folder holding model_index.json and part of the AR stage: `load_model` and the loader node at
    queue time name every missing file at once; the node lists the folder (so the message is seen), and the
    complete AR stage passes."""
    from specar.model_loaders import registry
    from specar.nodes import models
    folder = os.path.join(comfy["models_dir"], "specar", "GLM-Image-partial")
    os.makedirs(os.path.join(folder, "vision_language_encoder"))
    shutil.copy(os.path.join(tiny[0], "vision_language_encoder", "config.json"),
                os.path.join(folder, "vision_language_encoder"))
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump({"_class_name": "GlmImagePipeline"}, f)
    real = glm_image.importlib.util.find_spec  # the AR stage's files only (the DiT's are checked with diffusers)
    monkeypatch.setattr(glm_image.importlib.util, "find_spec", lambda n, *a: None if n == "diffusers" else real(n, *a))
    monkeypatch.setattr(models, "load_model", registry.load_model)
    want = ["vision_language_encoder/generation_config.json", "vision_language_encoder/model.safetensors",
            "processor/tokenizer.json", "processor/tokenizer_config.json", "processor/processor_config.json",
            "processor/chat_template.jinja"]
    with pytest.raises(ValueError) as e:
        specar.load_model(folder, resolution=SIZE)
    assert all(w in str(e.value) for w in want) and "6 files" in str(e.value)
    assert "vision_language_encoder/config.json" not in str(e.value)
    assert "GLM-Image-partial" in models.model_choices()
    err = models.loader_error("GLM-Image-partial", "1024x1024")
    assert err is not None and all(w in err for w in want), err
    for sub in ("vision_language_encoder", "processor"):
        shutil.copytree(os.path.join(tiny[0], sub), os.path.join(folder, sub), dirs_exist_ok=True)
    assert models.loader_error("GLM-Image-partial", "1024x1024") is None


def test_the_live_preview_shows_the_preview_grid_then_the_target(mdl):
    """A live preview on the two-grid model shows the preview grid while it is sampled, then the target grid, each
    code coloured by its VQ codebook vector (planted: no preview for the first grid)."""
    from specar.samplers.preview import PartialImage
    shown = []
    preview = PartialImage(mdl, lambda images, done, total: shown.append((images[0].size, done, total)),
                           min_interval_s=0.0, share=0.99)
    res = specar.generate(mdl, PROMPT, backend="ar", seed=6, options=dict(preview=preview))
    sizes = [size for size, _, _ in shown]
    first = sizes.index((2, 3))  # PIL (W, H): the 3x2 target grid
    assert first > 0 and set(sizes[:first]) == {(13, 19)} and set(sizes[first:]) == {(2, 3)}
    assert [t for _, _, t in shown] == [19 * 13] * first + [6] * (len(shown) - first)
    colors = mdl.decode_preview(res.tokens[None])[0]
    assert colors.size == (2, 3) and len(colors.getcolors()) == len(set(res.tokens.flatten().tolist()))


def test_the_install_lines_are_what_is_tested(monkeypatch):
    """requirements-glm-image.txt and the pyproject extra pin the diffusers the suite decodes with and a transformers
    it runs on; a transformers without the GlmImage classes is one line naming that file (planted: 4.x)."""
    import re
    from importlib.metadata import version
    with open(glm_image.REQUIREMENTS) as f:
        pins = dict(re.findall(r"^(\w+)([=><].*)$", f.read(), re.M))
    assert pins == {"transformers": ">=5.24", "diffusers": "==0.42.1"}
    with open(os.path.join(os.path.dirname(glm_image.REQUIREMENTS), "pyproject.toml")) as f:
        assert 'glm-image = ["transformers>=5.24", "diffusers==0.42.1"]' in f.read()
    have = tuple(int(x) for x in re.findall(r"\d+", version("transformers"))[:2])
    assert have >= (5, 24), version("transformers")
    if importlib_util_find("diffusers"):
        assert version("diffusers") == "0.42.1", "the suite decodes with another diffusers than the pin"
    monkeypatch.setattr(__import__("transformers"), "GlmImageForConditionalGeneration", None)  # the current one
    with pytest.raises(ValueError, match="needs transformers >= 5.*requirements-glm-image.txt"):
        glm_image.GlmImageARModel("/nonexistent")


def importlib_util_find(name):
    import importlib.util
    return importlib.util.find_spec(name) is not None


def pil_to_tensor_of(images):
    from specar.nodes.core import pil_to_tensor
    return pil_to_tensor(images)


@pytest.mark.parametrize("flavour", ["v3", "v1"])
def test_the_example_workflow_runs_on_the_tiny_folder(tiny, comfy, monkeypatch, flavour):
    """example_workflows/api/SpecAR - GLM-Image.json (its flat twin for the V1 nodes) through the node classes, the
    tiny folder as models/specar/GLM-Image: the loader at 1024x1024 (256 + 1024 tokens), the sampler at the
    checkpoint's sampling; the DiT left out (diffusers hidden: the long test decodes)."""
    from specar.model_loaders import registry
    from specar.nodes import models
    from support.node_harness import EXAMPLES, load_json, node_classes, run_api_workflow
    folder = os.path.join(comfy["models_dir"], "specar", "GLM-Image")
    shutil.copytree(tiny[0], folder)
    with open(os.path.join(folder, "model_index.json"), "w") as f:  # the AR stage's parts of the released layout
        json.dump({"_class_name": "GlmImagePipeline"}, f)
    real = glm_image.importlib.util.find_spec
    monkeypatch.setattr(glm_image.importlib.util, "find_spec", lambda n, *a: None if n == "diffusers" else real(n, *a))
    monkeypatch.setattr(models, "load_model", registry.load_model)
    prompt = load_json(os.path.join(EXAMPLES, "api", "SpecAR - GLM-Image.json"))
    if flavour == "v3":  # the UI file's loader (what the template browser opens) has the API twin's values, valid
        from support.node_harness import comfy_validation_errors, read_ui_values
        loader = next(n for n in load_json(os.path.join(EXAMPLES, "SpecAR - GLM-Image.json"))["nodes"]
                      if n["type"] == "SpecARModelLoader")
        cls = node_classes("v3")["SpecARModelLoader"]
        read = read_ui_values(cls, loader["widgets_values"], "GLM-Image loader")
        assert read == prompt[str(loader["id"])]["inputs"] and comfy_validation_errors(cls, read) == []
    outputs, uis = run_api_workflow(prompt, node_classes(flavour))
    (sampler,) = [nid for nid in prompt if prompt[nid]["class_type"] == "SpecARSampler"]
    image, tokens, stats, _ = outputs[sampler]
    s = json.loads(stats)
    # no DiT: the codes' colours at the chosen size, and the summary says no decoder ran
    assert tokens["tokens"].shape == (1, 32, 32) and image.shape == (1, 1024, 1024, 3)
    assert "no image decoder ran" in s["summary"] and s["notes"][0].startswith("no DiT in"), s["summary"]
    assert s["image_tokens"] == 256 + 1024 and s["backend"] == "auto"
    assert (s["sampling"]["temperature"], s["sampling"]["top_p"]) == (0.9, 0.75)


def test_device_auto_loads_on_the_gpu_if_any_else_the_cpu(tiny):
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert specar.load_model(os.path.join(tiny[0], "vision_language_encoder"), device="auto", resolution=SIZE).device.type == want.type
