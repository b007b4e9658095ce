"""The example workflows: real nodes with valid values, up to date with tests/support/workflows.py, executed through
the node classes as ComfyUI's executor would; a SpecAR 0.1 API prompt; the demo workflow on the real demo model.
The nodes run without ComfyUI: stand-ins from tests/support/comfy_stubs.py through the `comfy` fixture (tests/conftest.py).
"""
import glob
import json
import os

import pytest
import torch

import specar
from specar.nodes import core, models, v1
from specar.samplers.backends import SCHEMAS
from support.node_harness import (
    EXAMPLES, CORE_NODES, FRONTEND_ONLY, flavours, node_classes, execute, comfy_validation_errors, ui_files,
    load_json, read_ui_values, run_api_workflow, sampler_values)


def test_example_workflows_reference_real_nodes_with_valid_values():
    classes = node_classes("v3")  # the layout of current ComfyUI (DynamicCombo)
    for path in ui_files():
        name = os.path.basename(path)
        wf = load_json(path)
        nodes = {n["id"]: n for n in wf["nodes"]}
        assert len(nodes) == len(wf["nodes"]) and wf["last_node_id"] >= max(nodes)
        assert {"SpecARModelLoader", "SpecARSampler"} <= {n["type"] for n in wf["nodes"]}
        api = load_json(os.path.join(EXAMPLES, "api", name))
        for n in wf["nodes"]:
            assert n["type"] in classes or n["type"] in CORE_NODES or n["type"] in FRONTEND_ONLY, n["type"]
            if n["type"] not in classes:
                continue
            if n["type"] == "SpecARModelLoader" and ("GLM-Image" in name or "Emu3.5" in name):
                continue  # its model is a folder the user adds: tests/test_glm_image.py (test_emu35.py) checks it
            read = read_ui_values(classes[n["type"]], n["widgets_values"], f"{name}: {n['type']}")
            if n["type"] == "SpecARModelLoader":  # the embedded demo model; GLM-Image's its folder (test_glm_image)
                assert read["model"] == ("GLM-Image" if "GLM-Image" in name else "demo"), name
            # the API-format twin has the same values
            assert {k: v for k, v in api[str(n["id"])]["inputs"].items() if not isinstance(v, list)} == read
            assert comfy_validation_errors(classes[n["type"]], read) == []
            if n["type"] == "SpecARSampler":
                core.backend_config(read)  # valid: no ValueError
        link_ids = set()
        for link_id, src, src_slot, dst, dst_slot, kind in wf["links"]:
            link_ids.add(link_id)
            s, d = nodes[src], nodes[dst]
            assert s["outputs"][src_slot]["type"] == kind and link_id in s["outputs"][src_slot]["links"]
            assert d["inputs"][dst_slot]["type"] == kind and d["inputs"][dst_slot]["link"] == link_id
            if s["type"] in classes:
                assert classes[s["type"]].RETURN_TYPES[src_slot] == kind
            dst_name = d["inputs"][dst_slot]["name"]
            want = CORE_NODES[d["type"]][dst_name] if d["type"] in CORE_NODES else \
                classes[d["type"]].INPUT_TYPES()["required"][dst_name][0]
            assert want == kind, f"{name}: link {link_id} carries {kind} into {d['type']}.{dst_name} ({want})"
        assert wf["last_link_id"] >= max(link_ids)
        assert os.path.isfile(path[:-5] + ".jpg"), f"{name} has no thumbnail"
        # the API-format twin describes the same graph
        ui_nodes = {str(k): v for k, v in nodes.items() if v["type"] not in FRONTEND_ONLY}
        assert set(api) == set(ui_nodes) and all(api[k]["class_type"] == ui_nodes[k]["type"] for k in api)


def test_example_workflows_are_up_to_date():
    from support import workflows
    for name, desc in workflows.WORKFLOWS.items():
        assert load_json(os.path.join(EXAMPLES, f"{name}.json")) == json.loads(json.dumps(workflows.build_ui(desc)))
        assert load_json(os.path.join(EXAMPLES, "api", f"{name}.json")) == json.loads(json.dumps(workflows.build_api(desc)))
    backends = [n["inputs"]["backend"] for n in load_json(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json")).values()
                if n["class_type"] == "SpecARSampler"]
    assert backends == list(SCHEMAS)  # every backend, ADT-Tree's lossy relaxed mode off
    side = load_json(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json"))
    assert not any(n["inputs"].get("backend.relaxed") for n in side.values())
    saved = [n for n in side.values() if n["class_type"] == "SaveImage"]
    assert len(saved) == len(SCHEMAS) and all(n["inputs"]["filename_prefix"].startswith("specar/") for n in saved)


@pytest.mark.parametrize("flavour", flavours())
def test_api_workflows_run_through_the_node_classes(flavour, comfy):
    classes = node_classes(flavour)
    for path in sorted(glob.glob(os.path.join(EXAMPLES, "api", "*.json"))):
        if "GLM-Image" in path or "Emu3.5" in path:
            continue  # a folder, not the demo model: tests/test_glm_image.py and test_emu35.py run them
        comfy["progress"].clear()
        prompt = load_json(path)
        outputs, uis = run_api_workflow(prompt, classes)
        samplers = [nid for nid in prompt if prompt[nid]["class_type"] == "SpecARSampler"]
        assert samplers
        for nid in samplers:
            image, tokens, stats, heat = outputs[nid]
            assert image.shape == (1, 4, 4, 3) and heat.shape == image.shape
            s = json.loads(stats)
            assert s["backend"] == prompt[nid]["inputs"]["backend"] and s["image_tokens"] == 16 and s["nfe"] >= 1
            label = SCHEMAS[s["backend"]].label
            assert s["summary"].startswith(f"{label}: 16 tokens in {s['nfe'] + 1} forward passes")
            assert uis[nid]["text"] == ["\n".join([s["summary"]] + s["notes"])] and s["backend_label"] == label
            assert json.loads(uis[nid]["specar_stats"][0]) == s
            assert tokens["tokens"].shape == (1, 4, 4)
        assert comfy["progress"] and comfy["progress"][-1][0] == comfy["progress"][-1][1]
        assert len(comfy["loaded"]) == 1  # one model for all samplers, loaded once
    # the same seed gives the same tokens whichever flavour of node ran it
    side = load_json(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json"))
    out_a, _ = run_api_workflow(side, classes)
    out_b, _ = run_api_workflow(side, classes)
    for nid in side:
        if side[nid]["class_type"] == "SpecARSampler":
            assert torch.equal(out_a[nid][1]["tokens"], out_b[nid][1]["tokens"])


def test_legacy_api_prompt_samples_what_the_new_layout_does(comfy):
    """A SpecAR 0.1 API prompt (shared names, window 0 / cfg -1 / top_k 0 = defaults) runs, and samples
    exactly what the same settings in the current layout sample."""
    model = models.resolve(execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0][0])
    legacy = dict(prompt="x", negative_prompt="", seed=5, backend="sjd_pac", cfg_scale=-1.0, temperature=1.0,
                  top_k=0, top_p=1.0, window=0, init="random", coupling="maximal", coupling_strength=1.0,
                  tree_depth=2, tree_width=3, continuation=True, batch_size=1)
    old = core.run_sampler(model, legacy)
    new = core.run_sampler(model, sampler_values(seed=5, backend="sjd_pac", sjd_pac_tree_depth=2,
                                                 sjd_pac_tree_width=3, sjd_pac_init="random"))
    assert torch.equal(old[1]["tokens"], new[1]["tokens"])
    assert json.loads(old[2])["params"] == json.loads(new[2])["params"]


def _demo_model():
    try:
        return specar.load_model("demo", device="cpu")
    except ValueError as e:
        pytest.skip(f"demo model not available: {e}")


def test_demo_workflow_with_the_real_demo_model(comfy, monkeypatch):
    model = _demo_model()
    monkeypatch.setattr(models, "load_model", lambda name, device=None, dtype=None: model)
    classes = node_classes("v3")
    prompt = load_json(os.path.join(EXAMPLES, "api", "SpecAR demo - auto.json"))
    outputs, uis = run_api_workflow(prompt, classes)
    image, tokens, stats, heat = outputs["10"]
    geo = model.geometry
    assert image.shape[0] == 1 and image.shape[-1] == 3 and image.shape[1] > geo.height
    assert heat.shape == image.shape
    s = json.loads(stats)
    assert s["backend"] == "auto" and s["image_tokens"] == geo.num_image_tokens and s["step_compression"] > 1.5
    assert uis["10"]["text"][0].startswith(f"Auto: {geo.num_image_tokens} tokens in {s['nfe'] + 1} forward passes")
    decoded, = execute(classes["SpecARDecode"], tokens=tokens)[0]
    assert torch.equal(decoded, image)
