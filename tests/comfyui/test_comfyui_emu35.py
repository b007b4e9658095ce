"""The Emu3.5-Image example workflow in a real ComfyUI server (`make test-comfyui`, both releases), on the tiny
random-weight Emu3.5-Image folder conftest.py writes into models/specar (tests/support/tiny_emu35.py): the loader lists
it, the example as shipped runs with one change (its size, 1024x1024 -> 256x256: 16 x 16 codes, for the tests'
time), `auto` gives plain AR's pixels (same_image_as_ar on, its default), and the sampling that ran is the
checkpoint's recommended one (cfg 5, top-k 5120 capped at the tiny codebook's 4 codes)."""
import json
import os

import pytest

if not (os.environ.get("COMFYUI_DIR") or os.environ.get("COMFYUI_VERSION")):
    pytest.skip("no ComfyUI: set COMFYUI_DIR (a folder made by ../shared/comfyui/setup.sh) or COMFYUI_VERSION",
                allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = "SpecAR - Emu3.5-Image.json"
MODEL, SIZE = "Emu3.5-Image", "256x256"
LOADER, SAMPLER, SAVED = "1", "10", "20"  # the example's node ids: loader, sampler, SaveImage


def example(server, backend=None):
    with open(os.path.join(ROOT, "example_workflows", "api", *([] if server.dynamic else ["flat"]), EXAMPLE)) as f:
        p = json.load(f)
    assert p[LOADER]["inputs"]["model"] == MODEL and p[LOADER]["inputs"]["resolution"] == "1024x1024"
    p[LOADER]["inputs"]["resolution"] = SIZE
    if backend is not None:  # AR: no parameters of its own (the dynamic layout drops auto's)
        inputs = p[SAMPLER]["inputs"]
        for key in [k for k in inputs if k.startswith("backend.")]:
            del inputs[key]
        inputs["backend"] = backend
    return p


def run(server, prompt):
    entry, _ = server.run(prompt)
    messages = [m[0] for m in entry["status"]["messages"] if m[0] in ("execution_success", "execution_error")]
    assert messages == ["execution_success"], (entry["status"], server.log()[-3000:])
    (image,) = entry["outputs"][SAVED]["images"]
    return server.image_pixels(image), json.loads(entry["outputs"][SAMPLER]["specar_stats"][0])


def test_the_emu35_example_runs_on_the_tiny_folder_and_gives_ars_image(server):
    if not os.path.isdir(os.path.join(server.tmp, "specar", MODEL)):
        pytest.skip("conftest.py did not build the tiny Emu3.5-Image folder (its output says why)")
    model = server.object_info["SpecARModelLoader"]["input"]["required"]["model"]  # V1 list, or V3 COMBO
    assert MODEL in (model[0] if isinstance(model[0], list) else model[1]["options"])
    pixels, stats = run(server, example(server))
    assert len(pixels) == 256 * 256 * 3 and stats["backend"] == "auto" and stats["image_tokens"] == 16 * 16, stats
    assert (stats["sampling"]["cfg_scale"], stats["sampling"]["top_k"]) == (5.0, 4), stats["sampling"]
    ar_pixels, ar_stats = run(server, example(server, backend="ar"))
    assert ar_stats["backend"] == "ar" and ar_pixels == pixels
