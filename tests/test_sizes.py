"""Each family offers the sizes its checkpoints generate (`ModelFamily.resolutions`, listed by the loader),
every listed size becomes that family's load options, and any other size is refused naming the allowed ones."""
import json
import re

import pytest

from specar.model_loaders.families.chameleon import LUMINA_TARGETS, lumina_sizes
from specar.model_loaders.families.emu3 import DOWNSAMPLE, EMU3_RATIOS, emu3_sizes, generation_grid
from specar.model_loaders.registry import FAMILIES
from specar.model_loaders.resolutions import RESOLUTIONS, load_options


def folder(tmp_path, name, config=None, files=()):
    d = tmp_path / name
    d.mkdir()
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    for f in files:
        (d / f).write_bytes(b"")
    return str(d)


@pytest.fixture
def folders(tmp_path):
    return {
        "janus": folder(tmp_path, "janus", {"model_type": "janus"}),
        "emu3": folder(tmp_path, "emu3", {"model_type": "emu3"}),
        "lumina": folder(tmp_path, "lumina", {"model_type": "chameleon",
                                               "architectures": ["ChameleonXLLMXForConditionalGeneration"]}),
        "anole": folder(tmp_path, "anole", {"model_type": "chameleon"}),
        "llamagen": folder(tmp_path, "llamagen", None, ["c2i_XL_384.pt", "vq_ds16_c2i.pt"]),
    }


def test_the_loader_list_holds_every_familys_sizes():
    for f in FAMILIES.values():
        assert set(f.resolutions) <= set(RESOLUTIONS), f.name
    assert len(RESOLUTIONS) == len(set(RESOLUTIONS)) and RESOLUTIONS[0] == "model default"
    assert FAMILIES["janus"].resolutions == ("384x384",)
    assert FAMILIES["llamagen"].resolutions == ("256x256", "384x384", "512x512")
    assert len(FAMILIES["emu3"].resolutions) == len(EMU3_RATIOS) >= 7
    lumina = {f"{w}x{h}" for t in LUMINA_TARGETS for w, h in lumina_sizes(t)}
    assert lumina <= set(FAMILIES["chameleon"].resolutions) and "512x512" in FAMILIES["chameleon"].resolutions


def test_emu3_sizes_give_back_their_own_grid():
    for (w, h), ratio in zip(emu3_sizes(), EMU3_RATIOS):
        from specar.model_loaders.families.emu3 import size_options
        o = size_options("", w, h)
        gh, gw = generation_grid(o["ratio"], o["image_area"])
        assert (gw * DOWNSAMPLE, gh * DOWNSAMPLE) == (w, h), (ratio, o)
        rw, rh = map(int, ratio.split(":"))
        assert abs(w / h - rw / rh) < 0.03 and abs(w * h - 518400) / 518400 < 0.02


def test_every_listed_size_loads_as_its_familys_options(folders):
    for w, h in emu3_sizes():
        assert load_options(folders["emu3"], f"{w}x{h}")["image_area"] == w * h
    for t in LUMINA_TARGETS:
        for w, h in lumina_sizes(t):
            o = load_options(folders["lumina"], f"{w}x{h}")
            assert o["resolution"] == f"{w}x{h}" and (w, h) in lumina_sizes(o["target_size"])
    for s in (256, 384, 512):
        assert load_options(folders["llamagen"], f"{s}x{s}") == {"image_size": s}
    assert load_options(folders["janus"], "384x384") == {"image_size": 384}


@pytest.mark.parametrize("which,size,message", [
    ("llamagen", "720x720", "LlamaGen generates the square sizes 256x256, 384x384, 512x512; got resolution '720x720'"),
    ("llamagen", "1024x576", "LlamaGen generates the square sizes 256x256, 384x384, 512x512"),
    ("janus", "1024x576", "Janus generates square images"),
    ("anole", "768x768", "Anole generates 512x512 only"),
    ("lumina", "720x720", "Lumina-mGPT does not offer 720x720: of the sizes listed, it offers"),
])
def test_other_sizes_are_refused_naming_the_allowed_ones(folders, which, size, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_options(folders[which], size)
