"""load_model's bad arguments and damaged files: a ValueError naming the value (or the file) and what is
allowed, never an AssertionError / AttributeError / SafetensorError from deep inside torch or transformers."""
import importlib.util
import os
import re
import shutil
import types

import pytest

import specar

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("options, message", [
    (dict(dtype="float8"), "dtype must be one of auto, float32, bfloat16, float16 (or bf16, fp16, fp32), got 'float8'"),
    (dict(device="gpu"), "device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    (dict(device="cuda:99"), "cuda"),
])
def test_bad_device_or_dtype_is_named(options, message):
    with pytest.raises(ValueError) as e:
        specar.load_model("demo", **options)
    assert message in str(e.value)


def test_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda': no CUDA GPU is available here"):
        specar.load_model("demo", device="cuda")


def test_dtype_aliases_load(monkeypatch):
    assert specar.load_model("demo", dtype="bf16") is not None
    assert specar.load_model("demo", dtype="auto") is not None


def test_damaged_weights_name_the_file(tmp_path):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("chameleon_builder", os.path.join(HERE, "test_chameleon.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    folder = tmp_path / "Lumina-mGPT-tiny"
    mod.build_tiny_chameleon(str(folder))
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # a partly copied file: header intact, tensors cut off
    with pytest.raises(ValueError) as e:
        specar.load_model(str(folder), layout="lumina", target_size=64, resolution="64x32")
    assert str(weights) in str(e.value)
    shutil.rmtree(folder)


def test_resolution_is_one_name_for_every_family(tmp_path, monkeypatch):
    """load_model(..., resolution="WxH") reaches every family as its own size options (or as `resolution` where
    its loader takes that name), and a size it does not offer is a ValueError, never a TypeError."""
    import dataclasses
    import inspect

    from specar.model_loaders import registry
    with pytest.raises(ValueError, match="generates at its own size only: choose resolution 'model default'"):
        specar.load_model("demo", resolution="512x512")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "chameleon", "architectures": '
                                        '["ChameleonXLLMXForConditionalGeneration"]}')  # Lumina-mGPT for chameleon
    for name, family in registry.FAMILIES.items():
        got = []
        native = "resolution" in inspect.signature(family.load).parameters

        def load(path, device=None, dtype=None, **kw):
            got.append(kw)
            return types.SimpleNamespace()  # a model: load_model names its quantization on it

        def load_native(path, device=None, dtype=None, resolution=None, **kw):  # the signature the family has
            got.append({**kw, **({} if resolution is None else {"resolution": resolution})})
            return types.SimpleNamespace()

        fake = dataclasses.replace(family, load=load_native if native else load)
        monkeypatch.setattr(registry, "family_of", lambda p, f=fake: f)
        for size in family.resolutions[:2]:
            registry.load_model(str(folder), resolution=size)
            w, h = (int(x) for x in size.split("x"))
            assert got[-1] == ({"resolution": size} if native else family.size_options(str(folder), w, h)), name
        registry.load_model(str(folder), resolution="model default")
        assert got[-1] == {}, name
        try:
            family.size_options(str(folder), 7, 7)
        except ValueError as e:  # a size the family does not offer: its own words (a native loader checks later)
            if not native:
                with pytest.raises(ValueError, match=re.escape(str(e))):
                    registry.load_model(str(folder), resolution="7x7")
