"""ComfyUI nodes without ComfyUI: schemas, workflows, execution with stubbed comfy modules."""
import glob
import json
import os
import sys
import types

import pytest
import torch

import specar
from specar.nodes import comfy_nodes, core
from specar.samplers.backends import BACKENDS
from specar.testing import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_NODE_TYPES = {"PreviewImage", "SaveImage"}


@pytest.fixture
def comfy_stubs(monkeypatch):
    """Minimal stand-ins for the ComfyUI modules the nodes touch."""
    calls = {"progress": [], "interrupt": False}
    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    mm = types.ModuleType("comfy.model_management")

    class ProgressBar:
        def __init__(self, total):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            calls["progress"].append((value, total))

    class InterruptProcessingException(Exception):
        pass

    utils.ProgressBar = ProgressBar
    mm.InterruptProcessingException = InterruptProcessingException
    mm.processing_interrupted = lambda: calls["interrupt"]
    mm.get_torch_device = lambda: torch.device("cpu")
    mm.unload_all_models = lambda: None
    comfy.utils, comfy.model_management = utils, mm
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.get_folder_paths = lambda name: []
    for name, mod in (("comfy", comfy), ("comfy.utils", utils), ("comfy.model_management", mm),
                      ("folder_paths", folder_paths)):
        monkeypatch.setitem(sys.modules, name, mod)
    tiny = tiny_model(16, (4, 4), seed=0, row_end=True)
    monkeypatch.setattr(core, "load_model", lambda name, device=None, dtype=None: tiny)
    core.free_models()
    return calls


def _widget_ok(kind, opts, value):
    if isinstance(kind, list):
        return value in kind
    if kind == "INT":
        return isinstance(value, int) and opts.get("min", -2**63) <= value <= opts.get("max", 2**64)
    if kind == "FLOAT":
        return isinstance(value, (int, float)) and opts.get("min", -1e30) <= value <= opts.get("max", 1e30)
    if kind == "BOOLEAN":
        return isinstance(value, bool)
    if kind == "STRING":
        return isinstance(value, str)
    return True


def test_node_schemas_are_valid():
    assert set(specar.NODE_CLASS_MAPPINGS) == set(specar.NODE_DISPLAY_NAME_MAPPINGS)
    for name, cls in specar.NODE_CLASS_MAPPINGS.items():
        inputs = cls.INPUT_TYPES()
        assert callable(getattr(cls, cls.FUNCTION)) and cls.CATEGORY == "SpecAR" and cls.DESCRIPTION
        assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS)
        for section in inputs.values():
            for iname, (kind, opts) in section.items():
                assert opts.get("tooltip"), f"{name}.{iname} has no tooltip"
                if "default" in opts:
                    assert _widget_ok(kind, opts, opts["default"]), f"{name}.{iname} default out of range"
    sampler = comfy_nodes.SpecARSampler.INPUT_TYPES()["required"]
    assert sampler["backend"][0] == list(BACKENDS)
    assert sampler["seed"][1]["control_after_generate"]


def _load_workflow(path):
    with open(path) as f:
        return json.load(f)


def test_example_workflows_reference_real_nodes_with_valid_values():
    ui_files = sorted(glob.glob(os.path.join(ROOT, "example_workflows", "*.json")))
    assert ui_files, "no example workflows"
    for path in ui_files:
        wf = _load_workflow(path)
        nodes = {n["id"]: n for n in wf["nodes"]}
        for n in wf["nodes"]:
            assert n["type"] in specar.NODE_CLASS_MAPPINGS or n["type"] in CORE_NODE_TYPES, n["type"]
            if n["type"] not in specar.NODE_CLASS_MAPPINGS:
                continue
            cls = specar.NODE_CLASS_MAPPINGS[n["type"]]
            widgets = [(k, v) for k, v in cls.INPUT_TYPES()["required"].items()
                       if not (isinstance(v[0], str) and v[0].startswith("SPECAR_"))]
            values = list(n["widgets_values"])
            for wname, (kind, opts) in widgets:
                value = values.pop(0)
                if wname == "model":
                    assert value == "demo"
                    continue
                assert _widget_ok(kind, opts, value), f"{path}: {n['type']}.{wname} = {value!r}"
                if opts.get("control_after_generate"):
                    assert values.pop(0) in ("fixed", "increment", "decrement", "randomize")
            assert not values, f"{path}: extra widget values {values}"
        for link_id, src, src_slot, dst, dst_slot, kind in wf["links"]:
            src_cls = specar.NODE_CLASS_MAPPINGS.get(nodes[src]["type"])
            if src_cls is not None:
                assert src_cls.RETURN_TYPES[src_slot] == kind
        api_path = os.path.join(ROOT, "example_workflows", "api", os.path.basename(path))
        assert os.path.exists(api_path), f"{path} has no API-format twin"


def _execute_api(path, comfy_stubs):
    prompt = _load_workflow(path)
    outputs = {}
    order = sorted(prompt, key=int)
    pending = list(order)
    while pending:
        for nid in list(pending):
            node = prompt[nid]
            args = {}
            ready = True
            for k, v in node["inputs"].items():
                if isinstance(v, list):
                    if v[0] not in outputs:
                        ready = False
                        break
                    args[k] = outputs[v[0]][v[1]]
                else:
                    args[k] = v
            if not ready:
                continue
            pending.remove(nid)
            cls = specar.NODE_CLASS_MAPPINGS.get(node["class_type"])
            if cls is None:
                outputs[nid] = ()
                continue
            out = getattr(cls(), cls.FUNCTION)(**args)
            outputs[nid] = out["result"] if isinstance(out, dict) else out
            if isinstance(out, dict):
                outputs[nid + ":ui"] = out["ui"]
    return outputs


def test_api_workflow_runs_through_the_node_classes(comfy_stubs):
    for path in sorted(glob.glob(os.path.join(ROOT, "example_workflows", "api", "*.json"))):
        outputs = _execute_api(path, comfy_stubs)
        samplers = [k for k in outputs if k.endswith(":ui")]
        assert samplers
        for key in samplers:
            image, tokens, stats, heat = outputs[key[:-3]]
            assert image.ndim == 4 and image.shape[-1] == 3 and 0 <= float(image.min()) and float(image.max()) <= 1
            assert heat.ndim == 4 and heat.shape[1:3] == image.shape[1:3]
            s = json.loads(stats)
            assert s["nfe"] >= 1 and "summary" in s
            assert outputs[key]["text"][0].startswith("AR ")
    assert comfy_stubs["progress"] and comfy_stubs["progress"][-1][0] == comfy_stubs["progress"][-1][1]


def test_bad_widget_values_give_the_nodes_own_error(comfy_stubs):
    model = comfy_nodes.SpecARModelLoader().load("demo")[0]
    sampler = comfy_nodes.SpecARSampler()
    base = dict(model=model, prompt="x", negative_prompt="", seed=0, backend="sjd", cfg_scale=-1.0, temperature=1.0,
                top_k=0, top_p=1.0, window=4, init="random", coupling="maximal", coupling_strength=1.0,
                tree_depth=3, tree_width=4, continuation=True)
    with pytest.raises(ValueError, match="backend must be one of"):
        sampler.sample(**{**base, "backend": "turbo"})
    with pytest.raises(ValueError, match="init must be one of"):
        sampler.sample(**{**base, "init": "diagonal"})
    with pytest.raises(ValueError, match="tree_width"):
        sampler.sample(**{**base, "backend": "sjd_pac", "tree_width": 17})
    assert "model must be one of" in comfy_nodes.SpecARModelLoader.VALIDATE_INPUTS("nope", "auto", "auto")


def test_cancel_stops_generation_and_model_stays_usable(comfy_stubs):
    model = comfy_nodes.SpecARModelLoader().load("demo")[0]
    sampler = comfy_nodes.SpecARSampler()
    args = dict(model=model, prompt="x", negative_prompt="", seed=0, backend="sjd_pac", cfg_scale=-1.0,
                temperature=1.0, top_k=0, top_p=1.0, window=4, init="random", coupling="maximal",
                coupling_strength=1.0, tree_depth=2, tree_width=4, continuation=True)
    comfy_stubs["interrupt"] = True
    with pytest.raises(sys.modules["comfy.model_management"].InterruptProcessingException):
        sampler.sample(**args)
    comfy_stubs["interrupt"] = False
    out = sampler.sample(**args)
    assert out["result"][0].shape[0] == 1


def test_decode_node_and_model_cache(comfy_stubs):
    loader = comfy_nodes.SpecARModelLoader()
    assert loader.load("demo")[0] is loader.load("demo")[0]  # cached across runs
    assert heatmap_ok()


def heatmap_ok():
    img = core.heatmap([[0, 1, 1], [1, 2, 2]], size=(4, 6))
    return img.shape == (4, 6, 3) and float(img.min()) >= 0 and float(img.max()) <= 1
