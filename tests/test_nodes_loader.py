"""The model loader node: folders listed, models cached and freed (also under ComfyUI's memory pressure), a
family registered later, resolution and offload options, failed loads, drafter folders.
The nodes run without ComfyUI: stand-ins from tests/support/comfy_stubs.py through the `comfy` fixture (tests/conftest.py).
"""
import json
import os
import re

import pytest
import torch

from specar.nodes import core, models, spec, v1
from specar.model_loaders.tiny import tiny_model
from support.node_harness import (
    stubs, flavours, node_classes, execute, comfy_validation_errors, queue_errors, sampler_values, run_sampler_node)


@pytest.mark.parametrize("flavour", flavours())
def test_model_loader_lists_folders_caches_and_frees(flavour, comfy):
    stubs.make_model_folder(comfy["models_dir"], "janus-pro-1b", "janus")
    stubs.make_model_folder(comfy["models_dir"], "emu3-gen", "emu3")
    os.makedirs(os.path.join(comfy["models_dir"], "specar", "not-a-model"))
    loader = node_classes(flavour)["SpecARModelLoader"]
    choices = loader.INPUT_TYPES()["required"]["model"]
    choices = choices[0] if flavour == "v1" else choices[1]["options"]
    assert choices == ["demo", "emu3-gen", "janus-pro-1b"]

    m1, = execute(loader, model="demo", device="auto", dtype="auto")[0]
    m2, = execute(loader, model="demo", device="auto", dtype="auto")[0]
    assert models.resolve(m1) is models.resolve(m2) and len(comfy["loaded"]) == 1  # cached across runs
    assert isinstance(m1, models.ModelHandle)  # ComfyUI caches the handle, not the model
    execute(loader, model="janus-pro-1b", device="cpu", dtype="bfloat16")
    assert comfy["loaded"][-1] == (os.path.join(comfy["models_dir"], "specar", "janus-pro-1b"), "cpu", "bfloat16")
    comfy["mm"].unload_all_models()  # ComfyUI's "unload models" frees ours too
    assert not models._cache and comfy.get("unloaded") == 1
    execute(loader, model="demo", device="auto", dtype="auto")
    assert len(comfy["loaded"]) == 3

    assert comfy_validation_errors(loader, dict(model="demo", device="auto", dtype="auto")) == []
    messages = []  # device: ComfyUI's own choice check; model: the V3 loader's check, which names the choices
    assert sorted(comfy_validation_errors(loader, dict(model="nope", device="tpu", dtype="auto"),
                                          messages=messages)) == ["device", "model"]  # (V1: ComfyUI checks the model)
    assert messages == ([] if flavour == "v1" else ["model must be one of demo, emu3-gen, janus-pro-1b; got 'nope'"])
    with pytest.raises(ValueError, match=r"model must be one of demo, emu3-gen, janus-pro-1b; got 'nope'"):
        execute(loader, model="nope", device="auto", dtype="auto")
    with pytest.raises(ValueError, match="dtype must be one of"):
        execute(loader, model="demo", device="auto", dtype="int8")


def test_a_family_registered_later_reaches_the_loader_and_the_guidance_help(comfy, monkeypatch):
    """A family is its ModelFamily object: registered, it is recognised in the model folder, listed, offered
    in the help, sized by its own size_options and loaded by its own load, with no other change."""
    from specar.model_loaders import registry
    from specar.model_loaders.family import ModelFamily, Sampling
    loaded = []

    def size_options(folder, w, h):
        if w % 64 or h % 64:
            raise ValueError(f"Fake-Gen offers multiples of 64, got {w}x{h}")
        return {"tokens_wide": w // 64, "tokens_high": h // 64}

    fake = ModelFamily(name="fake", label="Fake-Gen", files="a fake.marker file", sizes="Fake-Gen multiples of 64",
                       load=lambda folder, **kw: loaded.append((folder, kw)) or tiny_model(16, (4, 4), seed=0),
                       size_options=size_options, sampling=(Sampling("Fake-Gen", 2.5, 77),),
                       detect=lambda folder, config: os.path.isfile(os.path.join(folder, "fake.marker")))
    monkeypatch.setitem(registry.FAMILIES, "fake", fake)
    monkeypatch.setattr(models, "load_model", registry.load_model)  # the real registry, not the fixture's stand-in
    folder = os.path.join(comfy["models_dir"], "specar", "fake-gen")
    os.makedirs(folder)
    open(os.path.join(folder, "fake.marker"), "w").close()
    loader = v1.SpecARModelLoader.INPUT_TYPES()
    assert "fake-gen" in loader["required"]["model"][0]
    assert "Fake-Gen: a fake.marker file" in loader["required"]["model"][1]["tooltip"]
    assert "Fake-Gen multiples of 64" in loader["optional"]["resolution"][1]["tooltip"]
    guidance = v1.SpecARSampler.INPUT_TYPES()["required"]["guidance"][1]["tooltip"]
    assert "Fake-Gen: cfg 2.5, top-k 77" in guidance
    execute(v1.SpecARModelLoader, model="fake-gen", device="cpu", dtype="auto", resolution="1024x576")
    assert loaded == [(folder, {"device": "cpu", "dtype": None, "tokens_wide": 16, "tokens_high": 9})]
    with pytest.raises(ValueError, match="Fake-Gen offers multiples of 64, got 720x720"):
        execute(v1.SpecARModelLoader, model="fake-gen", device="cpu", dtype="auto", resolution="720x720")
    with pytest.raises(ValueError, match=r"offload 'auto' .* is offered for .*Emu3.5.*; '.*fake-gen' is "
                                         r"Fake-Gen"):
        execute(v1.SpecARModelLoader, model="fake-gen", device="cpu", dtype="auto", offload="auto")


@pytest.mark.parametrize("flavour", flavours())
def test_loader_resolution_and_offload_become_the_familys_options(flavour, comfy):
    loader = node_classes(flavour)["SpecARModelLoader"]
    stubs.make_model_folder(comfy["models_dir"], "emu3-gen", "emu3")
    stubs.make_model_folder(comfy["models_dir"], "janus-pro-7b", "janus")
    lumina = stubs.make_model_folder(comfy["models_dir"], "lumina-mgpt-768", "chameleon")
    with open(os.path.join(lumina, "config.json"), "w") as f:
        json.dump({"model_type": "chameleon", "architectures": ["ChameleonXLLMXForConditionalGeneration"]}, f)
    stubs.make_model_folder(comfy["models_dir"], "anole-7b", "chameleon")

    def load(model, resolution="model default", offload="none"):
        execute(loader, model=model, device="cpu", dtype="auto", resolution=resolution, offload=offload)
        return comfy["options"]

    assert load("emu3-gen") == {}
    assert load("emu3-gen", "1024x768", "auto") == {"image_area": 1024 * 768, "ratio": "4:3", "device_map": "auto"}
    assert load("janus-pro-7b", "384x384") == {"image_size": 384}
    assert load("lumina-mgpt-768", "1024x576") == {"resolution": "1024x576", "target_size": 768}
    assert load("lumina-mgpt-768", "768x1280") == {"resolution": "768x1280", "target_size": 1024}
    assert load("lumina-mgpt-768", "512x512") == {"resolution": "512x512", "target_size": 512}
    for model, resolution, offload, message in [
        ("janus-pro-7b", "1024x768", "none", "Janus generates square images"),
        ("anole-7b", "768x768", "none", "Anole generates 512x512 only"),
        ("lumina-mgpt-768", "720x720", "none", "Lumina-mGPT does not offer 720x720: of the sizes listed, it offers"),
        ("demo", "512x512", "none", "generates at its own size only"),
        ("demo", "model default", "auto", "offload 'auto' (accelerate device_map) is offered for Janus"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            load(model, resolution, offload)
    # refused when the prompt is queued, naming what the chosen model allows, once, under resolution (planted:
    # under the validate function's one input, unique_id / model, whatever the bad value)
    bad, messages = queue_errors({"1": {"class_type": "SpecARModelLoader", "inputs": dict(
        model="demo", device="auto", dtype="auto", resolution="512x512", offload="none")}},
        {"SpecARModelLoader": loader})["1"]
    assert bad == ["resolution"]
    assert messages[0].startswith("resolution '512x512' is not offered for demo: choose one of model default")
    # a size in no family's list: ComfyUI's own check of the list, under resolution, and nothing else
    assert queue_errors({"1": {"class_type": "SpecARModelLoader", "inputs": dict(
        model="demo", device="auto", dtype="auto", resolution="640x480")}}, {"SpecARModelLoader": loader}) == {
        "1": (["resolution"], [])}


@pytest.mark.parametrize("flavour", flavours())
def test_freed_model_reloads_transparently_and_memory_pressure_frees_it(flavour, comfy):
    classes = node_classes(flavour)
    handle, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    first = run_sampler_node(classes["SpecARSampler"], handle, sampler_values(seed=2))[0]
    comfy["mm"].free_memory(1 << 20, "cpu")  # ComfyUI loads something small: enough memory left, ours stays
    assert models._cache and len(comfy["loaded"]) == 1
    comfy["free_bytes"] = 0  # ComfyUI freed what it could and the device is still short: ours goes
    comfy["mm"].free_memory(1 << 30, "cpu")
    assert not models._cache and comfy["free_memory_calls"][-1] == (1 << 30, "cpu")
    again = run_sampler_node(classes["SpecARSampler"], handle, sampler_values(seed=2))[0]  # the cached handle
    assert len(comfy["loaded"]) == 2 and torch.equal(first[1]["tokens"], again[1]["tokens"])
    comfy["free_bytes"] = 0
    comfy["mm"].free_memory(1 << 30, "cuda:0")  # pressure on another device: not ours
    assert models._cache


def test_a_failed_load_keeps_the_working_model(comfy, monkeypatch):
    handle, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    model = models.resolve(handle)

    def broken(*a, **k):
        raise ValueError("no CUDA GPU")

    monkeypatch.setattr(models, "load_model", broken)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        execute(v1.SpecARModelLoader, model="demo", device="cpu", dtype="float32")
    assert list(models._cache.values()) == [model]  # still there, still the one a run uses
    assert models.resolve(handle) is model


def test_drafter_folders_are_listed_and_resolved(comfy):
    base = os.path.join(comfy["models_dir"], spec.DRAFTER_FOLDER)
    for name, kind, fmt in (("my-hawk-heads", "hawk", 1), ("my-eagle", "eagle", 1), ("broken", None, 1),
                            ("old-hawk", "hawk", None)):  # a drafter.json this SpecAR does not read: not listed
        os.makedirs(os.path.join(base, name))
        if kind:
            with open(os.path.join(base, name, "drafter.json"), "w") as f:
                json.dump({"kind": kind, "format": fmt}, f)
            open(os.path.join(base, name, "drafter.safetensors"), "wb").close()
    req = v1.SpecARSampler.INPUT_TYPES()["required"]
    assert req["hawk_heads"][0] == [spec.BESIDE_MODEL, "my-hawk-heads"]
    assert req["adt_tree_drafter"][0] == [spec.BESIDE_MODEL, "my-eagle"]
    settings, config = core.backend_config(sampler_values(backend="hawk", hawk_heads="my-hawk-heads"))
    assert config.params()["heads"] == os.path.join(base, "my-hawk-heads")
    settings, config = core.backend_config(sampler_values(backend="hawk"))
    assert config.params()["heads"] == ""  # beside the model


@pytest.mark.parametrize("flavour", flavours())
def test_loader_offers_per_model_values_and_refuses_others_when_queued(flavour, comfy):
    """What each model allows (from its family) reaches the web extension, which narrows the lists to it; any
    other value is refused when the prompt is queued, naming what the chosen model allows."""
    from specar.model_loaders.precision.quantize import QUANTIZE_MODES
    from specar.model_loaders.resolutions import RESOLUTIONS
    stubs.make_model_folder(comfy["models_dir"], "janus-pro-7b", "janus")
    stubs.make_model_folder(comfy["models_dir"], "emu3-gen", "emu3")
    loader = node_classes(flavour)["SpecARModelLoader"]
    allowed = loader.INPUT_TYPES()["required"]["model"][1]["specar_allowed"]
    assert allowed["demo"] == {"resolution": ["model default"], "quantize": list(QUANTIZE_MODES), "offload": ["none"]}
    janus = allowed["janus-pro-7b"]
    assert "384x384" in janus["resolution"] and "1024x768" not in janus["resolution"]
    assert janus["offload"] == ["none", "auto"] and janus["quantize"] == list(QUANTIZE_MODES)
    assert len(allowed["emu3-gen"]["resolution"]) > len(janus["resolution"])  # any W x H
    assert set(allowed["emu3-gen"]["resolution"]) <= set(RESOLUTIONS)

    def refused(**values):
        errors = queue_errors({"1": {"class_type": "SpecARModelLoader", "inputs": dict(
            dict(device="auto", dtype="auto"), **values)}}, {"SpecARModelLoader": loader})
        return errors.get("1", ([], []))

    assert refused(model="janus-pro-7b", resolution="384x384", quantize="int4") == ([], [])
    bad, messages = refused(model="janus-pro-7b", resolution="1024x768")
    assert bad == ["resolution"] and "Janus generates square images" in messages[0]
    assert f"choose one of {', '.join(janus['resolution'])}" in messages[0]
    bad, messages = refused(model="demo", offload="auto")
    assert "is offered for Janus" in messages[0] and "choose one of none" in messages[0]
    bad, messages = refused(model="janus-pro-7b", quantize="int8", offload="auto")
    assert bad == ["quantize"] and "choose offload none, or quantize none" in messages[0]
    bad, messages = refused(model="no-such-model")  # once: ComfyUI's combo check (V1) or the validate function's
    assert bad == ["model"] and all("model must be one of demo" in m for m in messages)
    with pytest.raises(ValueError, match="choose offload none, or quantize none"):  # the same check when it runs
        execute(loader, model="janus-pro-7b", device="cpu", dtype="auto", quantize="int8", offload="auto")


def test_the_demo_model_loads_quantized_from_the_loader_and_samples_as_ar(comfy, monkeypatch):
    """The pack's own model can be tried quantized in ComfyUI: the loader's int8 / int4 reach the demo's loader,
    whose linear layers become QuantLinear, and a speculative backend gives the quantized model's AR image (its
    drafters, trained on the unquantized weights, are accepted for it)."""
    from specar.model_loaders import registry
    from specar.model_loaders.precision.quantize import QuantLinear
    monkeypatch.setattr(models, "load_model", registry.load_model)  # the real demo model, not the fixture's
    torch.set_num_threads(1)
    for mode in ("int8", "int4"):
        handle, = execute(v1.SpecARModelLoader, model="demo", device="cpu", dtype="auto", quantize=mode)[0]
        decoder = models.resolve(handle).decoder
        quantized = [m for m in decoder.modules() if isinstance(m, QuantLinear)]
        assert quantized and all(m.bits == int(mode[3:]) for m in quantized)
        ar = execute(v1.SpecARSampler, model=handle, **sampler_values(backend="ar", seed=1))[0]
        fast = execute(v1.SpecARSampler, model=handle, **sampler_values(backend="hawk", seed=1))[0]
        assert torch.equal(ar[1]["tokens"], fast[1]["tokens"])
        assert json.loads(fast[2])["nfe"] < json.loads(ar[2])["nfe"]
