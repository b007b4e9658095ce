"""offload="auto" (offload.py's plan) for the transformers families on the CPU, with tiny folders: under a memory cap
some decoder layers go to disk, everything the adapters read directly (embeddings, heads, the VQ model) stays on the
model's device, and the first logits and AR tokens are those of the model held whole (same seed)."""
import os

import pytest
import torch

import specar

PROMPT = "a red cat"


def janus(folder):
    from test_janus import build_tiny_janus
    build_tiny_janus(folder)
    return folder, {}, "model.language_model.layers"


def emu3(folder):
    from test_emu3 import GRID_2X2, build_tiny_emu3
    build_tiny_emu3(folder)
    return folder, GRID_2X2, "model.text_model.layers"


def chameleon(folder):
    from test_chameleon import SQUARE, build_tiny_chameleon
    build_tiny_chameleon(folder)
    return folder, SQUARE, "model.layers"


def glm_image(folder):
    pytest.importorskip("transformers", minversion="5")
    from support.tiny_glm_image import build_tiny_glm_image
    build_tiny_glm_image(folder)
    return os.path.join(folder, "vision_language_encoder"), {"resolution": "64x96"}, "model.language_model.layers"


@pytest.fixture(scope="module", params=[janus, emu3, chameleon, glm_image])
def family(request, tmp_path_factory):
    folder, options, layers = request.param(str(tmp_path_factory.mktemp(request.param.__name__) / "tiny"))
    return folder, options, layers, specar.load_model(folder, device="cpu", **options)


def sizes(model, layers):
    """Bytes of the model outside `layers`, and of its largest layer (weights and buffers)."""
    size = {n: p.numel() * p.element_size() for n, p in [*model.model.named_parameters(), *model.model.named_buffers()]}
    stack = sum(v for n, v in size.items() if n.startswith(layers + "."))
    layer = max(sum(v for n, v in size.items() if n.startswith(f"{layers}.{i}.")) for i in range(2))
    return sum(size.values()) - stack, layer


def test_offload_under_a_memory_cap_puts_layers_on_disk_and_keeps_the_whole_models_logits_and_tokens(family, tmp_path):
    folder, options, layers, whole = family
    rest, layer = sizes(whole, layers)  # the least that works: what stays, and room to bring one layer in
    m = specar.load_model(folder, device="cpu", device_map="auto", max_memory={"cpu": rest + layer + 64},
                          offload_folder=str(tmp_path), **options)
    placed = getattr(m.model, "hf_device_map", {})  # both layers on disk (with two, a cap holding one and a layer's room holds both)
    assert {v for k, v in placed.items() if k.startswith(layers)} == {"disk"}, placed
    assert all(v == "cpu" for k, v in placed.items() if not k.startswith(layers)), placed
    assert m.model.get_submodule(layers)[1].mlp.down_proj.weight.device.type == "meta"  # not held in memory
    first, whole_first = m.preceding_stage() or m, whole.preceding_stage() or whole  # GLM-Image: the preview grid
    enc = first.encode_prompt(PROMPT)
    assert torch.allclose(first.start(enc, 1, True, 4).first.cond, whole_first.start(enc, 1, True, 4).first.cond,
                          atol=1e-5)
    want = specar.generate(whole, PROMPT, backend="ar", seed=3, batch_size=2, options=dict(reproducible=True)).sequence
    for backend in ("ar", "sjd"):
        got = specar.generate(m, PROMPT, backend=backend, seed=3, batch_size=2, options=dict(reproducible=True)).sequence
        assert torch.equal(got, want), backend


def test_a_cap_below_what_stays_on_the_device_is_refused_naming_it(family):
    folder, options, layers, whole = family
    rest, layer = sizes(whole, layers)
    with pytest.raises(ValueError, match=rf"max_memory\['cpu'\] is {rest} bytes; the model needs at least "
                                         rf"{rest + layer} there"):
        specar.load_model(folder, device="cpu", device_map="auto", max_memory={"cpu": rest}, **options)
