"""The transformers floor: the family loaders need transformers >= TRANSFORMERS_FLOOR (requirements.txt and
pyproject.toml declare the same), an older one gets one line naming both versions, and on the floor itself
(`make test-floor`: a venv with that transformers and the tiny folders of tests/support/floor_models.py, given as
SPECAR_FLOOR_MODELS) Janus-Pro, Emu3, Lumina-mGPT and Anole load and generate."""
import os
import re

import pytest

import specar
from specar.model_loaders.files import hf_files
from support import CHECKOUT, needs_checkout

FLOOR = ".".join(map(str, hf_files.TRANSFORMERS_FLOOR))
MODELS = os.environ.get("SPECAR_FLOOR_MODELS")


@needs_checkout
def test_requirements_and_pyproject_declare_the_floor():
    for name in ("requirements.txt", "pyproject.toml"):
        with open(os.path.join(CHECKOUT, name)) as f:
            assert re.search(rf'transformers>={re.escape(FLOOR)}\b', f.read()), name


def test_an_older_transformers_gets_one_line(monkeypatch, tmp_path):
    import transformers
    monkeypatch.setattr(transformers, "__version__", "4.51.3")
    folder = tmp_path / "Janus-Pro"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "janus"}')
    with pytest.raises(ValueError) as e:
        specar.load_model(str(folder))
    assert str(e.value).startswith(f"janus models need transformers >= {FLOOR}, you have 4.51.3")
    assert "\n" not in str(e.value)


CASES = [("janus", {}), ("emu3", dict(image_area=384, ratio="3:2")),
         ("chameleon", dict(layout="lumina", target_size=64, resolution="64x32")), ("chameleon", dict(layout="anole"))]


@pytest.mark.skipif(not MODELS, reason="make test-floor: SPECAR_FLOOR_MODELS = folders of tests/support/floor_models.py")
@pytest.mark.parametrize("family, options", CASES, ids=["janus-pro", "emu3", "lumina-mgpt", "anole"])
def test_family_loads_and_generates_on_the_floor(family, options):
    import transformers
    assert hf_files.transformers_version() == hf_files.TRANSFORMERS_FLOOR, transformers.__version__
    model = specar.load_model(os.path.join(MODELS, family), **options)
    H, W = model.geometry.height, model.geometry.width
    ar = specar.generate(model, "a red cat", backend="ar", seed=0, sampling=dict(temperature=0))
    for backend in ("sjd", "sjd_pac"):
        res = specar.generate(model, "a red cat", backend=backend, seed=0)
        assert res.tokens.shape == (H, W) and res.image is not None
    greedy = specar.generate(model, "a red cat", backend="sjd", seed=3, sampling=dict(temperature=0))
    assert (greedy.tokens == ar.tokens).all()  # lossless: greedy SJD is greedy AR
