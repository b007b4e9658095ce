"""GLM-Image image-to-image on the tiny random-weight real classes (tests/test_glm_image.py's folder): one or two
reference images through the processor's i2i chat template, their VQ codes and M-RoPE positions in the prompt, the
target grid sampled after them (no preview grid).

Checks: `ar` reproduces transformers' own `generate` with the same images token for token (greedy), and a prompt
with the references' codes dropped or their positions laid out as text does not; every backend gives AR's tokens;
the sampler node's reference_images input gives an image; the refusals (a model without references, three images,
a bad image); the DiT gets the references (skipped without diffusers).
"""
import copy
import importlib.util
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "GlmImageForConditionalGeneration"):
    pytest.skip("this transformers has no GLM-Image", allow_module_level=True)

import specar
from specar.model_loaders.families import glm_image, glm_image_refs

_spec = importlib.util.spec_from_file_location("glm_image_builders", os.path.join(os.path.dirname(__file__),
                                                                                  "test_glm_image.py"))
_builders = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_builders)
CODES, PROMPT, build_tiny_dit, build_tiny_glm_image = (_builders.CODES, _builders.PROMPT, _builders.build_tiny_dit,
                                                       _builders.build_tiny_glm_image)

TOL = 1e-5
SIZE = (128, 96)  # W x H pixels: a target grid of 3 rows of 4


def references(n=2, seed=0):
    """Random RGB images (PIL): grids 5x4, then 3x6 (one code per 32 pixels)."""
    from PIL import Image
    g = torch.Generator().manual_seed(seed)
    shapes = [(160, 128), (96, 192)][:n]  # H x W; the processor halves them, then 16-pixel patches
    return [Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()) for h, w in shapes]


def as_tensor(im):
    """ComfyUI's IMAGE of a PIL image: [1, H, W, 3] floats 0..1."""
    return torch.from_numpy(__import__("numpy").asarray(im, dtype="float32") / 255)[None]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("glm-i2i") / "GLM-Image-tiny")
    hf, proc = build_tiny_glm_image(root)
    m = specar.load_model(os.path.join(root, "vision_language_encoder"), resolution=f"{SIZE[0]}x{SIZE[1]}")
    return root, hf, proc, m


def transformers_generate(hf, proc, images, n):
    """transformers' own greedy generate with the images: (its n target codes, its logits of the codes at each
    step [n, CODES])."""
    messages = [[{"role": "user", "content": [{"type": "image", "image": im} for im in images]
                  + [{"type": "text", "text": PROMPT}]}]]
    inputs = proc.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                      processor_kwargs=dict(target_h=SIZE[1], target_w=SIZE[0]))
    out = hf.generate(**inputs, max_new_tokens=n, do_sample=False, suppress_tokens=[CODES, CODES + 1],
                      output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), torch.cat(out.logits)[:, :CODES]


def adapter_logits(m, prompt, tokens):
    """The adapter's logits of the codes at each position of `tokens` after `prompt` (one forward over the chain)."""
    s = m.start(prompt, batch=1, cfg=False, draft_capacity=len(tokens))
    out = m.forward(s, torch.tensor([tokens[:-1]]), list(range(-1, len(tokens) - 2)))
    return torch.cat([s.first.cond, out.cond], 1)[0].float()


@pytest.mark.parametrize("n_refs", [1, 2])
def test_ar_reproduces_transformers_generate_with_references(tiny, n_refs):
    """transformers' generate with the images (its vision encoder, VQ codes and M-RoPE layout) samples the target
    grid only: AR's greedy tokens are its tokens, and the adapter's logits along them its logits. Planted: the
    references' codes dropped (the placeholder id in their place), or their grids laid out as one row each (the
    M-RoPE rows and columns wrong) -> other logits."""
    root, hf, proc, m = tiny
    images = references(n_refs)
    prompt = m.reference_prompt(PROMPT, images)
    assert [(h, w) for _, h, w in prompt.grids] == [(5, 4), (3, 6)][:n_refs]
    assert [tuple(c.shape) for c in prompt.codes] == [(h, w) for _, h, w in prompt.grids]
    ref, ref_logits = transformers_generate(hf, proc, images, m.geometry.num_image_tokens)
    res = specar.generate(m, PROMPT, backend="ar", sampling=dict(temperature=0), images=images)
    assert res.tokens.shape == (3, 4) and res.preceding is None and res.prompt.grids == prompt.grids
    assert res.tokens.flatten().tolist() == ref and res.stats.image_tokens == 12  # no preview grid
    assert torch.allclose(adapter_logits(m, prompt, ref), ref_logits, atol=TOL, rtol=0)

    dropped = copy.deepcopy(prompt)
    for s, h, w in prompt.grids:
        dropped.cond[s:s + h * w] = [m.model.config.image_token_id] * (h * w)
    one_row = copy.deepcopy(prompt)
    one_row.grids = tuple((s, 1, h * w) for s, h, w in prompt.grids)
    for planted in (dropped, one_row):
        assert (adapter_logits(m, planted, ref) - ref_logits).abs().max() > 1e-3


@pytest.mark.parametrize("backend", list(specar.BACKENDS))
def test_every_backend_gives_ar_tokens_with_references(tiny, backend, monkeypatch):
    m = tiny[3]
    monkeypatch.setattr(m, "random_drafter_seed", 0, raising=False)  # hawk / adt_tree: random-weight drafters
    images = references(2)
    ar = specar.generate(m, PROMPT, backend="ar", seed=3, batch_size=2, images=images)
    res = specar.generate(m, PROMPT, backend=backend, seed=3, batch_size=2, images=images)
    assert res.tokens.shape == (2, 3, 4) and torch.equal(res.tokens, ar.tokens)


def test_guidance_with_references(tiny):
    """cfg_scale other than 1: the negative branch has the same references at the same positions; SJD gives AR's
    tokens, and guidance changes them."""
    m, images = tiny[3], references(1)
    ar = specar.generate(m, PROMPT, backend="ar", seed=2, sampling=dict(cfg_scale=3.0), negative_prompt="a dog",
                         images=images)
    assert torch.equal(specar.generate(m, PROMPT, backend="sjd", seed=2, sampling=dict(cfg_scale=3.0),
                                       negative_prompt="a dog", images=images).tokens, ar.tokens)
    assert not torch.equal(specar.generate(m, PROMPT, backend="ar", seed=2, images=images).tokens, ar.tokens)


def test_references_as_tensors_and_the_refusals(tiny):
    m = tiny[3]
    images = references(2)
    # ComfyUI's IMAGE: [B, H, W, C] floats 0..1 (one per reference here: the two differ in size)
    as_tensors = [as_tensor(im)
                  for im in images]
    assert m.reference_prompt(PROMPT, as_tensors).cond == m.reference_prompt(PROMPT, images).cond
    with pytest.raises(ValueError, match="1 to 2 reference images, got 3"):
        specar.generate(m, PROMPT, images=images + images[:1])
    with pytest.raises(ValueError, match="1 to 2 reference images, got 0"):
        specar.generate(m, PROMPT, images=[])
    with pytest.raises(ValueError, match=r"images\[0\] must be a PIL image .* got \(4, 4\)"):
        specar.generate(m, PROMPT, images=[torch.zeros(4, 4)])
    with pytest.raises(ValueError, match="image-to-image samples the target grid"):
        m.preceding_stage().reference_prompt(PROMPT, images)
    demo = specar.load_model("demo")
    with pytest.raises(ValueError, match=r"demo \(\w+\) takes no reference images: image-to-image .* GLM-Image's"):
        specar.generate(demo, "a red circle", images=images[:1])


def test_the_sampler_node_with_a_reference_image(tiny, comfy, monkeypatch):
    """The sampler node's optional reference_images input (ComfyUI IMAGE [1, H, W, C]): the target grid after the
    reference, AR's tokens for the same image through the library, and an image out."""
    from specar.model_loaders import registry
    from specar.nodes import models
    from support.node_harness import execute, node_classes, run_sampler_node, sampler_values
    folder = os.path.join(comfy["models_dir"], "specar", "GLM-Image-tiny")
    shutil.copytree(tiny[0], folder)
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump({"_class_name": "GlmImagePipeline"}, f)
    real = glm_image.importlib.util.find_spec  # no DiT files here: the node shows the codes
    monkeypatch.setattr(glm_image.importlib.util, "find_spec", lambda n, *a: None if n == "diffusers" else real(n, *a))
    monkeypatch.setattr(models, "load_model", registry.load_model)
    classes = node_classes("v1")
    assert "reference_images" in classes["SpecARSampler"].INPUT_TYPES()["optional"]
    handle, = execute(classes["SpecARModelLoader"], model="GLM-Image-tiny", device="cpu", dtype="auto",
                      resolution="256x256")[0]  # a listed size: an 8x8 grid
    im = references(1)[0]
    ref_image = as_tensor(im)
    (image, tokens, stats, _), _ = run_sampler_node(classes["SpecARSampler"], handle, sampler_values(
        prompt=PROMPT, seed=5, backend="sjd", same_image_as_ar=True, reference_images=ref_image))
    ar = specar.generate(models.resolve(handle), PROMPT, backend="ar", seed=5, images=[im])
    assert torch.equal(tokens["tokens"][0], ar.tokens) and json.loads(stats)["image_tokens"] == 64
    assert image.shape == (1, 256, 256, 3)  # no DiT here: the codes in their preview colours, at the chosen size
    with pytest.raises(ValueError, match="takes no reference images"):
        demo, = execute(classes["SpecARModelLoader"], model="demo", device="cpu", dtype="auto",
                        resolution="model default")[0]
        run_sampler_node(classes["SpecARSampler"], demo, sampler_values(prompt="x", reference_images=ref_image))


def test_the_dit_gets_the_references(tmp_path, monkeypatch):
    pytest.importorskip("diffusers", reason="the glm-image extra (diffusers) is not installed: no DiT to decode with")
    full = str(tmp_path / "GLM-Image-full")
    build_tiny_dit(full, *build_tiny_glm_image(full))
    m = specar.load_model(full, resolution=f"{SIZE[0]}x{SIZE[1]}", dit_steps=2)
    pipe, seen = m.dit_pipeline(), {}
    real = type(pipe).__call__
    monkeypatch.setattr(type(pipe), "__call__", lambda self, **kw: seen.update(kw) or real(self, **kw))
    images = references(2)
    res = specar.generate(m, PROMPT, backend="sjd", seed=1, images=images)
    assert res.image.size == SIZE
    assert seen["image"] == images and seen["source_image_grid_thw"][0].tolist() == [[1, 10, 8], [1, 6, 12]]
    up = [torch.nn.functional.interpolate(c[None, None].float(), scale_factor=2).flatten() for c in res.prompt.codes]
    assert torch.equal(seen["prior_token_image_ids"][0].cpu(), torch.cat(up).long())
    again = m.decode_tokens(res.tokens[None], prompt=res.prompt)[0]
    assert again.tobytes() == res.image.tobytes()
