"""Opt-in: SpecAR in ComfyUI's own frontend (headless Chromium, driven by tooling/screenshot_nodes.py). Set
SPECAR_COMFYUI to a ComfyUI checkout (and SPECAR_COMFYUI_PYTHON to its Python, if not this one; SPECAR_CHROMIUM to a
Chromium)."""
import glob
import json
import os
import sys

import pytest

from specar.nodes import layouts, v1
from specar.samplers.backends import SCHEMAS
from support.node_harness import EXAMPLES, api_twin, load_json, stop_process

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEGACY_LAYOUT = ["prompt", "negative_prompt", "seed", "control_after_generate", "backend", "cfg_scale", "temperature",
                 "top_k", "top_p", "window", "init", "coupling", "coupling_strength", "tree_depth", "tree_width",
                 "continuation", "batch_size"]  # a SpecAR 0.1 sampler's widgets_values, in order


def _effective(settings):
    """SamplerSettings with every parameter of its backend (the default where none was given)."""
    params = {p.name: settings.params.get(p.name, p.default) for p in SCHEMAS[settings.backend].params}
    return settings.backend, params, settings.sampling


@pytest.mark.skipif(not os.environ.get("SPECAR_COMFYUI"), reason="set SPECAR_COMFYUI to a ComfyUI checkout")
def test_real_frontend_loads_example_and_0_1_workflows(tmp_path):
    """In ComfyUI's own frontend (headless Chromium): the example workflows load with the values of their
    API twins (what app.graphToPrompt would queue), and SpecAR 0.1 workflows are migrated by web/specar.js
    to the values the server reads from the 0.1 layout, which the server accepts."""
    import urllib.request
    from specar.tooling import screenshot_nodes as shots
    chromium = os.environ.get("SPECAR_CHROMIUM")
    try:
        shots.find_chromium(chromium)
    except SystemExit:
        pytest.skip("needs Chromium (apt-get install chromium-headless-shell)")
    python = os.environ.get("SPECAR_COMFYUI_PYTHON", sys.executable)
    proc, url = shots.start_comfyui(os.environ["SPECAR_COMFYUI"], python, str(tmp_path))
    defaults = {n: opts.get("default") for n, (kind, opts) in v1.SpecARSampler.INPUT_TYPES()["required"].items()}
    try:
        with shots.Frontend(url, chromium) as fe:
            for path in sorted(glob.glob(os.path.join(EXAMPLES, "*.json"))):
                fe.load(load_json(path))
                got = fe.read()["prompt"]
                with urllib.request.urlopen(url + "/object_info/SpecARSampler", timeout=10) as r:
                    want = load_json(api_twin(os.path.basename(path), json.loads(r.read())))
                assert {k: (n["class_type"], n["inputs"]) for k, n in got.items()} == \
                    {k: (n["class_type"], n["inputs"]) for k, n in want.items()}, os.path.basename(path)
            for name in ("specar_0.1_side_by_side.json", "specar_0.1_custom_values.json"):
                ui = load_json(os.path.join(CHECKOUT, "tests", "data", name))
                fe.load(ui)
                state = fe.read()
                samplers = [n for n in ui["nodes"] if n["type"] == "SpecARSampler"]
                assert samplers
                for n in samplers:
                    old = dict(zip(LEGACY_LAYOUT, n["widgets_values"]))
                    shown = state["nodes"][str(n["id"])]
                    new = {k: v for k, v in state["prompt"][str(n["id"])]["inputs"].items() if k != "model"}
                    assert shown["properties"].get("specar_migrated_from") == "0.1", (name, n["id"])
                    assert _effective(layouts.sampler_settings(new)) == _effective(layouts.sampler_settings(old)), \
                        (name, n["id"], new)
                    for k in ("prompt", "negative_prompt", "seed", "temperature", "top_p", "batch_size"):
                        assert new[k] == old[k], (name, n["id"], k)
                    assert shown["widgets"]["control_after_generate"] == old["control_after_generate"]
                    assert new["preview"] == defaults["preview"]  # an input 0.1 did not have: its default
                # the server accepts what the frontend would queue (then the queue is dropped)
                req = urllib.request.Request(url + "/prompt", data=json.dumps({"prompt": state["prompt"]}).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert json.loads(r.read())["node_errors"] == {}, name
                for path, body in (("/queue", {"clear": True}), ("/interrupt", {})):
                    urllib.request.urlopen(urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                                                  headers={"Content-Type": "application/json"}),
                                           timeout=30).read()
    finally:
        stop_process(proc)
