"""ComfyUI nodes without ComfyUI: schemas (V1 and V3), example workflows, execution of the API-format
workflows through the node classes with stubbed ComfyUI modules, the nodes' own validation,
cancellation, the model cache. The stubs live in tests/comfy_stubs.py and are put in sys.modules
with monkeypatch, so they are gone after each test (no conftest). One opt-in test starts a real
ComfyUI server: set SPECAR_COMFYUI to a ComfyUI checkout (and SPECAR_COMFYUI_PYTHON to its Python,
if not this one)."""
import asyncio
import glob
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

import specar
from specar.nodes import core, spec, v1, v3
from specar.samplers.backends import BACKEND_PARAMS
from specar.testing import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "example_workflows")
CORE_NODES = {"PreviewImage": {"images": "IMAGE"}, "SaveImage": {"images": "IMAGE"}}
FRONTEND_ONLY = {"Note", "MarkdownNote"}  # virtual nodes of the ComfyUI frontend (not in API format)

_spec = importlib.util.spec_from_file_location("specar_comfy_stubs", os.path.join(ROOT, "tests", "comfy_stubs.py"))
stubs = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, stubs)  # its own name: dataclasses need the module registered
_spec.loader.exec_module(stubs)


@pytest.fixture
def comfy(monkeypatch, tmp_path):
    """ComfyUI stand-ins in sys.modules (undone after the test); "demo" is a tiny random model."""
    state = {"interrupt": False, "progress": [], "loaded": []}
    models_dir = str(tmp_path / "models")
    for name, module in stubs.stub_modules(state, models_dir).items():
        monkeypatch.setitem(sys.modules, name, module)

    def fake_load_model(name_or_path, device=None, dtype=None):
        state["loaded"].append((name_or_path, device, dtype))
        return tiny_model(16, (4, 4), seed=0, row_end=True)

    monkeypatch.setattr(core, "load_model", fake_load_model)
    monkeypatch.setattr(core, "_hooked", [])
    core.free_models()
    state["mm"] = sys.modules["comfy.model_management"]
    state["models_dir"] = models_dir
    yield state
    core.free_models()


def flavours():
    return ["v1", "v3"]


def node_classes(flavour):
    if flavour == "v1":
        return dict(v1.NODE_CLASS_MAPPINGS)
    return {cls.__name__: cls for cls in v3.build_nodes(stubs.make_io())}


def validate_fn(cls):
    """What ComfyUI calls to validate a node's inputs (None if the class has none)."""
    if hasattr(cls, "define_schema"):
        return cls.validate_inputs if "validate_inputs" in vars(cls) else None
    return getattr(cls, "VALIDATE_INPUTS", None)


def execute(cls, **inputs):
    """Run a node class as ComfyUI does; returns (outputs tuple, ui dict or None)."""
    if hasattr(cls, "define_schema"):
        out = getattr(cls, cls.FUNCTION)(**inputs)
        return tuple(out.args), out.ui
    out = getattr(cls(), cls.FUNCTION)(**inputs)
    if isinstance(out, dict):
        return tuple(out["result"]), out.get("ui")
    return tuple(out), None


def widget_values_ok(kind, opts, value):
    if isinstance(kind, list):
        return value in kind
    if kind == "COMBO":
        return value in opts["options"]
    if kind == "INT":
        return isinstance(value, int) and not isinstance(value, bool) and opts["min"] <= value <= opts["max"]
    if kind == "FLOAT":
        return isinstance(value, (int, float)) and math.isfinite(value) and opts["min"] <= value <= opts["max"]
    if kind == "BOOLEAN":
        return isinstance(value, bool)
    if kind == "STRING":
        return isinstance(value, str)
    return False


# ---------------------------------------------------------------------------------------------
# import and schemas

def test_import_needs_no_comfyui():
    code = ("import sys, specar; from specar import nodes; "
            "assert nodes.NODE_API == 'v1', nodes.NODE_API; "
            "assert not {'comfy', 'comfy_api', 'folder_paths', 'server'} & set(sys.modules), sorted(sys.modules); "
            "print(sorted(specar.NODE_CLASS_MAPPINGS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert "SpecARSampler" in out.stdout
    assert set(specar.NODE_CLASS_MAPPINGS) == set(specar.NODE_DISPLAY_NAME_MAPPINGS) == {
        "SpecARModelLoader", "SpecARSampler", "SpecARDecode"}
    assert specar.WEB_DIRECTORY == "./web" and os.path.isfile(os.path.join(ROOT, "web", "specar.js"))


def test_pack_picks_v3_when_comfy_api_is_there(comfy):
    # execute nodes/__init__.py afresh (not registered in sys.modules) with comfy_api present
    init = os.path.join(ROOT, "nodes", "__init__.py")
    mspec = importlib.util.spec_from_file_location("specar.nodes", init,
                                                   submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    assert module.NODE_API == "v3"
    assert set(module.NODE_CLASS_MAPPINGS) == set(v1.NODE_CLASS_MAPPINGS)
    assert all(hasattr(c, "define_schema") for c in module.NODE_CLASS_MAPPINGS.values())
    ext = asyncio.run(module.comfy_entrypoint())
    asyncio.run(ext.on_load())
    listed = asyncio.run(ext.get_node_list())
    assert [c.GET_SCHEMA().node_id for c in listed] == ["SpecARModelLoader", "SpecARSampler", "SpecARDecode"]
    assert "specar" in sys.modules["folder_paths"].folder_names_and_paths  # models/specar registered


@pytest.mark.parametrize("flavour", flavours())
def test_node_schemas_are_valid(flavour, comfy):
    classes = node_classes(flavour)
    assert set(classes) == {"SpecARModelLoader", "SpecARSampler", "SpecARDecode"}
    socket_types = {"IMAGE", "STRING", spec.MODEL_TYPE, spec.TOKENS_TYPE}
    for name, cls in classes.items():
        if flavour == "v3":
            cls.GET_SCHEMA()  # ids unique across inputs and outputs, constructors accept our keywords
        assert cls.CATEGORY == "SpecAR" and cls.DESCRIPTION
        assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS) >= 1
        assert all(t in socket_types for t in cls.RETURN_TYPES) and all(cls.OUTPUT_TOOLTIPS)
        inputs = cls.INPUT_TYPES()
        assert set(inputs) == {"required"}
        for iname, (kind, opts) in inputs["required"].items():
            assert opts.get("tooltip"), f"{name}.{iname} has no tooltip"
            assert isinstance(kind, list) or kind in {"INT", "FLOAT", "BOOLEAN", "STRING", "COMBO"} | socket_types
            if kind in ("INT", "FLOAT"):
                assert opts["min"] <= opts["max"]
            if "default" in opts:
                assert widget_values_ok(kind, opts, opts["default"]), f"{name}.{iname} default {opts['default']!r}"
    sampler = classes["SpecARSampler"]
    req = sampler.INPUT_TYPES()["required"]
    backend = req["backend"]
    assert (backend[0] if flavour == "v1" else backend[1]["options"]) == list(BACKEND_PARAMS)
    assert req["seed"][1]["control_after_generate"] and req["seed"][1]["max"] == 2**64 - 1
    for params in BACKEND_PARAMS.values():
        assert set(params) <= set(req), "a backend parameter has no widget"
    assert sampler.OUTPUT_NODE and sampler.RETURN_NAMES == ("image", "tokens", "stats", "acceptance_heatmap")
    assert sampler.RETURN_TYPES == ("IMAGE", "SPECAR_TOKENS", "STRING", "IMAGE")
    assert classes["SpecARModelLoader"].RETURN_TYPES == ("SPECAR_MODEL",)
    assert classes["SpecARModelLoader"].RETURN_NAMES == ("model",)


def test_v1_and_v3_schemas_agree(comfy):
    a, b = node_classes("v1"), node_classes("v3")
    for name in a:
        ia, ib = a[name].INPUT_TYPES()["required"], b[name].INPUT_TYPES()["required"]
        assert list(ia) == list(ib)  # same widget order: UI-format workflows work with both
        for k in ia:
            ka, oa = ia[k]
            kb, ob = ib[k]
            if isinstance(ka, list):
                assert kb == "COMBO" and ob["options"] == ka
            else:
                assert ka == kb
            for key in ("default", "min", "max", "tooltip", "control_after_generate", "multiline"):
                assert oa.get(key) == ob.get(key), (name, k, key)
        for attr in ("RETURN_TYPES", "RETURN_NAMES", "OUTPUT_TOOLTIPS", "CATEGORY", "OUTPUT_NODE"):
            assert getattr(a[name], attr) == getattr(b[name], attr), (name, attr)


def test_sampler_widgets_follow_backend_params(monkeypatch):
    monkeypatch.setitem(BACKEND_PARAMS, "hawk", {
        "window": (8, "drafts per forward"),
        "heads": (4, "trained draft heads used"),
        "lossy": (False, "relaxed acceptance (lossy)"),
        "delta": (0.1, "relaxation cap"),
        "variant": ("tree", "how candidates are arranged"),
    })
    req = v1.SpecARSampler.INPUT_TYPES()["required"]
    assert "hawk" in req["backend"][0]
    assert req["heads"][0] == "INT" and req["heads"][1]["default"] == 4 and "hawk" in req["heads"][1]["tooltip"]
    assert req["lossy"][0] == "BOOLEAN" and req["delta"][0] == "FLOAT" and req["variant"][0] == "STRING"
    assert "hawk 8" in req["window"][1]["tooltip"] and req["window"][1]["default"] == 0  # 0 = backend default
    assert spec.backend_values("hawk", {"window": 0, "heads": 2, "lossy": True, "delta": 0.2, "variant": "tree",
                                        "tree_depth": 3}) == {"window": 8, "heads": 2, "lossy": True, "delta": 0.2,
                                                              "variant": "tree"}
    assert spec.backend_values("sjd_pac", {"window": 0, "tree_depth": 3})["window"] == BACKEND_PARAMS["sjd_pac"]["window"][0]
    assert spec.backend_values("sjd", {"window": 32, "tree_depth": 3}) == {"window": 32}


# ---------------------------------------------------------------------------------------------
# model loader

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
    assert m1 is m2 and len(comfy["loaded"]) == 1  # cached across runs
    execute(loader, model="janus-pro-1b", device="cpu", dtype="bfloat16")
    assert comfy["loaded"][-1] == (os.path.join(comfy["models_dir"], "specar", "janus-pro-1b"), "cpu", "bfloat16")
    comfy["mm"].unload_all_models()  # ComfyUI's "unload models" frees ours too
    assert not core._cache and comfy.get("unloaded") == 1
    execute(loader, model="demo", device="auto", dtype="auto")
    assert len(comfy["loaded"]) == 3

    check = validate_fn(loader)
    assert check(model="demo", device="auto", dtype="auto") is True
    assert "model must be one of demo, emu3-gen, janus-pro-1b; got 'nope'" in check(model="nope", device="auto",
                                                                                     dtype="auto")
    assert "device must be one of" in check(model="demo", device="tpu", dtype="auto")
    with pytest.raises(ValueError, match="dtype must be one of"):
        execute(loader, model="demo", device="auto", dtype="int8")


# ---------------------------------------------------------------------------------------------
# example workflows

def _ui_files():
    files = sorted(glob.glob(os.path.join(EXAMPLES, "*.json")))
    assert files, "no example workflows"
    return files


def _load(path):
    with open(path) as f:
        return json.load(f)


def test_example_workflows_reference_real_nodes_with_valid_values():
    classes = v1.NODE_CLASS_MAPPINGS
    for path in _ui_files():
        name = os.path.basename(path)
        wf = _load(path)
        nodes = {n["id"]: n for n in wf["nodes"]}
        assert len(nodes) == len(wf["nodes"]) and wf["last_node_id"] >= max(nodes)
        assert {"SpecARModelLoader", "SpecARSampler"} <= {n["type"] for n in wf["nodes"]}
        for n in wf["nodes"]:
            assert n["type"] in classes or n["type"] in CORE_NODES or n["type"] in FRONTEND_ONLY, n["type"]
            if n["type"] not in classes:
                continue
            required = classes[n["type"]].INPUT_TYPES()["required"]
            widgets = [(k, kind, opts) for k, (kind, opts) in required.items()
                       if isinstance(kind, list) or kind in ("INT", "FLOAT", "BOOLEAN", "STRING")]
            values = list(n["widgets_values"])
            for wname, kind, opts in widgets:
                assert values, f"{name}: {n['type']} lacks a value for {wname}"
                value = values.pop(0)
                if wname == "model":
                    assert value == "demo", f"{name}: examples use the embedded demo model"
                assert widget_values_ok(kind, opts, value), f"{name}: {n['type']}.{wname} = {value!r}"
                if opts.get("control_after_generate"):
                    assert values.pop(0) in spec.CONTROL_AFTER_GENERATE
            assert not values, f"{name}: extra widget values {values}"
            check = classes[n["type"]].VALIDATE_INPUTS(**dict(zip([w[0] for w in widgets], _plain(n))))
            assert check is True, f"{name}: {check}"
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
        # the API-format twin describes the same graph with the same values
        api = _load(os.path.join(EXAMPLES, "api", name))
        ui_nodes = {str(k): v for k, v in nodes.items() if v["type"] not in FRONTEND_ONLY}
        assert set(api) == set(ui_nodes)
        for nid, node in api.items():
            assert node["class_type"] == ui_nodes[nid]["type"]
            if node["class_type"] in classes:
                req = classes[node["class_type"]].INPUT_TYPES()["required"]
                plain = dict(zip([k for k, (kind, _) in req.items() if isinstance(kind, list) or
                                  kind in ("INT", "FLOAT", "BOOLEAN", "STRING")], _plain(ui_nodes[nid])))
                assert {k: v for k, v in node["inputs"].items() if not isinstance(v, list)} == plain


def _plain(ui_node):
    """Widget values of a UI-format node without the control-after-generate entries."""
    values, out = list(ui_node["widgets_values"]), []
    req = v1.NODE_CLASS_MAPPINGS[ui_node["type"]].INPUT_TYPES()["required"]
    for _, (kind, opts) in req.items():
        if isinstance(kind, list) or kind in ("INT", "FLOAT", "BOOLEAN", "STRING"):
            out.append(values.pop(0))
            if opts.get("control_after_generate"):
                values.pop(0)
    return out


def test_example_workflows_are_up_to_date():
    from specar.nodes import workflows
    for name, desc in workflows.WORKFLOWS.items():
        assert _load(os.path.join(EXAMPLES, f"{name}.json")) == json.loads(json.dumps(workflows.build_ui(desc)))
        assert _load(os.path.join(EXAMPLES, "api", f"{name}.json")) == json.loads(json.dumps(workflows.build_api(desc)))
    backends = [n["inputs"]["backend"] for n in _load(os.path.join(EXAMPLES, "api", "specar_backends_side_by_side.json")).values()
                if n["class_type"] == "SpecARSampler"]
    assert backends == ["ar", "sjd", "scd", "sjd_pac"]


def run_api_workflow(prompt, classes):
    """Validate and execute an API-format prompt node by node, as ComfyUI's executor does."""
    outputs, uis = {}, {}
    pending = sorted(prompt, key=int)
    while pending:
        progressed = False
        for nid in list(pending):
            node = prompt[nid]
            if any(isinstance(v, list) and v[0] not in outputs for v in node["inputs"].values()):
                continue
            pending.remove(nid)
            progressed = True
            args = {k: outputs[v[0]][v[1]] if isinstance(v, list) else v for k, v in node["inputs"].items()}
            ct = node["class_type"]
            if ct in CORE_NODES:  # what PreviewImage / SaveImage need: [B,H,W,3] float in 0..1
                img = args["images"]
                assert img.ndim == 4 and img.shape[-1] == 3 and img.dtype == torch.float32
                assert 0 <= float(img.min()) and float(img.max()) <= 1
                outputs[nid] = ()
                continue
            cls = classes[ct]
            for k, v in node["inputs"].items():  # links carry the types the inputs want
                if isinstance(v, list):
                    src = classes.get(prompt[v[0]]["class_type"])
                    assert src.RETURN_TYPES[v[1]] == cls.INPUT_TYPES()["required"][k][0]
            check = validate_fn(cls)
            if check is not None:
                widgets = {k: v for k, v in node["inputs"].items() if not isinstance(v, list)}
                assert check(**widgets) is True
            outputs[nid], uis[nid] = execute(cls, **args)
        assert progressed, "cycle or missing node in workflow"
    return outputs, uis


@pytest.mark.parametrize("flavour", flavours())
def test_api_workflows_run_through_the_node_classes(flavour, comfy):
    classes = node_classes(flavour)
    for path in sorted(glob.glob(os.path.join(EXAMPLES, "api", "*.json"))):
        comfy["progress"].clear()
        prompt = _load(path)
        outputs, uis = run_api_workflow(prompt, classes)
        samplers = [nid for nid in prompt if prompt[nid]["class_type"] == "SpecARSampler"]
        assert samplers
        for nid in samplers:
            image, tokens, stats, heat = outputs[nid]
            assert image.shape == (1, 4, 4, 3) and heat.shape == image.shape
            s = json.loads(stats)
            assert s["backend"] == prompt[nid]["inputs"]["backend"] and s["image_tokens"] == 16 and s["nfe"] >= 1
            assert s["summary"].startswith("AR 16 steps") and uis[nid]["text"] == [s["summary"]]
            assert json.loads(uis[nid]["specar_stats"][0]) == s
            assert tokens["tokens"].shape == (1, 4, 4)
        assert comfy["progress"] and comfy["progress"][-1][0] == comfy["progress"][-1][1]
        assert len(comfy["loaded"]) == 1  # one model for all samplers, loaded once
    # the same seed gives the same tokens whichever flavour of node ran it
    side = _load(os.path.join(EXAMPLES, "api", "specar_backends_side_by_side.json"))
    out_a, _ = run_api_workflow(side, classes)
    out_b, _ = run_api_workflow(side, classes)
    for nid in side:
        if side[nid]["class_type"] == "SpecARSampler":
            assert torch.equal(out_a[nid][1]["tokens"], out_b[nid][1]["tokens"])


# ---------------------------------------------------------------------------------------------
# validation, cancellation, decode

BASE = dict(prompt="x", negative_prompt="", seed=0, backend="sjd", cfg_scale=-1.0, temperature=1.0, top_k=0,
            top_p=1.0, window=0, init="random", coupling="maximal", coupling_strength=1.0, tree_depth=3,
            tree_width=4, continuation=True, batch_size=1)


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("change, message", [
    ({"backend": "turbo"}, "backend must be one of ar, sjd, scd, sjd_pac; got 'turbo'"),
    ({"init": "diagonal"}, "init must be one of random, repeat_left"),
    ({"coupling": "strong"}, "coupling must be one of maximal, gumbel"),
    ({"window": 999}, "window must be in [0, 128], got 999"),
    ({"seed": -1}, "seed must be in [0, 18446744073709551615]"),
    ({"top_p": 0.0}, "top_p must be in [0.01, 1.0]"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"continuation": "yes"}, "continuation must be true or false"),
    ({"backend": "sjd_pac", "window": 4, "tree_depth": 5}, "tree_depth must be an int in [1, 4], got 5"),
])
def test_bad_widget_values_give_the_nodes_own_error(flavour, change, message, comfy):
    classes = node_classes(flavour)
    sampler, loader = classes["SpecARSampler"], classes["SpecARModelLoader"]
    values = {**BASE, **change}
    err = validate_fn(sampler)(**values)
    assert isinstance(err, str) and message in err
    model, = execute(loader, model="demo", device="auto", dtype="auto")[0]
    with pytest.raises(ValueError) as e:
        execute(sampler, model=model, **values)
    assert message in str(e.value)
    assert validate_fn(sampler)(**BASE) is True
    assert validate_fn(sampler)(**{**BASE, "backend": None}) is True  # a linked value is checked at run time


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("where", ["progress_hook", "interrupt_check"])
def test_cancel_stops_generation_and_model_stays_usable(flavour, where, comfy):
    classes = node_classes(flavour)
    sampler = classes["SpecARSampler"]
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    args = {**BASE, "backend": "sjd_pac", "window": 4, "tree_depth": 2, "seed": 3}
    reference = execute(sampler, model=model, **args)[0]
    comfy["progress"].clear()
    comfy["interrupt"] = True
    comfy["interrupt_in_progress_hook"] = where == "progress_hook"
    with pytest.raises(stubs.InterruptProcessingException):
        execute(sampler, model=model, **args)
    assert len(comfy["progress"]) == 1  # stopped after the first step
    assert comfy["interrupt"] is False  # the flag is consumed, as ComfyUI's own check does
    again = execute(sampler, model=model, **args)[0]
    assert torch.equal(again[1]["tokens"], reference[1]["tokens"])
    assert json.loads(again[2])["nfe"] == json.loads(reference[2])["nfe"]


@pytest.mark.parametrize("flavour", flavours())
def test_decode_node(flavour, comfy):
    classes = node_classes(flavour)
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    _, tokens, _, _ = execute(classes["SpecARSampler"], model=model, **BASE)[0]
    with pytest.raises(ValueError, match="no image decoder"):  # tiny random models have none
        execute(classes["SpecARDecode"], tokens=tokens)
    with pytest.raises(ValueError, match="tokens output of a SpecAR Sampler"):
        execute(classes["SpecARDecode"], tokens=torch.zeros(4, 4))


def test_heatmap_and_summary():
    img = core.heatmap([[0, 1, 1], [1, 2, 2]], size=(4, 6))
    assert img.shape == (4, 6, 3) and float(img.min()) >= 0 and float(img.max()) <= 1
    flat = core.heatmap([[0, 1], [2, 3]])
    assert torch.allclose(flat, flat[0, 0].expand_as(flat))  # AR: every step one token, one colour


def test_batch_gives_one_image_and_heatmap_per_sample(comfy):
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    image, tokens, stats, heat = execute(v1.SpecARSampler, model=model, **{**BASE, "batch_size": 3})[0]
    assert image.shape == (3, 4, 4, 3) and heat.shape == (3, 4, 4, 3) and tokens["tokens"].shape == (3, 4, 4)
    assert json.loads(stats)["batch"] == 3


# ---------------------------------------------------------------------------------------------
# the real demo model, and a real ComfyUI (opt-in)

def _demo_model():
    try:
        return specar.load_model("demo", device="cpu")
    except ValueError as e:
        pytest.skip(f"demo model not available: {e}")


def test_demo_workflow_with_the_real_demo_model(comfy, monkeypatch):
    model = _demo_model()
    monkeypatch.setattr(core, "load_model", lambda name, device=None, dtype=None: model)
    classes = node_classes("v3")
    prompt = _load(os.path.join(EXAMPLES, "api", "specar_demo.json"))
    outputs, uis = run_api_workflow(prompt, classes)
    image, tokens, stats, heat = outputs["10"]
    geo = model.geometry
    assert image.shape[0] == 1 and image.shape[-1] == 3 and image.shape[1] > geo.height
    assert heat.shape == image.shape
    s = json.loads(stats)
    assert s["backend"] == "sjd_pac" and s["image_tokens"] == geo.num_image_tokens and s["step_compression"] > 1.5
    assert uis["10"]["text"][0].startswith(f"AR {geo.num_image_tokens} steps -> SJD_PAC")
    decoded, = execute(classes["SpecARDecode"], tokens=tokens)[0]
    assert torch.equal(decoded, image)


@pytest.mark.skipif(not os.environ.get("SPECAR_COMFYUI"), reason="set SPECAR_COMFYUI to a ComfyUI checkout")
def test_real_comfyui_server(tmp_path):
    import socket
    import time
    import urllib.error
    import urllib.request

    comfy_dir = os.environ["SPECAR_COMFYUI"]
    python = os.environ.get("SPECAR_COMFYUI_PYTHON", sys.executable)
    nodes_dir = tmp_path / "custom_nodes"
    nodes_dir.mkdir()
    os.symlink(ROOT, nodes_dir / "specar")
    config = tmp_path / "extra_model_paths.yaml"
    config.write_text(f"specar_test:\n  base_path: {tmp_path}\n  custom_nodes: custom_nodes\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--extra-model-paths-config", str(config), "--disable-auto-launch",
                             "--output-directory", str(tmp_path / "output"), "--temp-directory", str(tmp_path)],
                            cwd=comfy_dir, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})

    def get(path):
        with urllib.request.urlopen(url + path, timeout=10) as r:
            return json.loads(r.read())

    try:
        deadline = time.time() + 180
        while True:
            try:
                info = get("/object_info")
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()[-4000:]
                time.sleep(1)
        assert {"SpecARModelLoader", "SpecARSampler", "SpecARDecode"} <= set(info), \
            (tmp_path / "server.log").read_text()[-4000:]
        assert info["SpecARSampler"]["category"] == "SpecAR"
        prompt = _load(os.path.join(EXAMPLES, "api", "specar_demo.json"))
        bad = json.loads(json.dumps(prompt))
        bad["10"]["inputs"]["backend"] = "turbo"
        req = urllib.request.Request(url + "/prompt", data=json.dumps({"prompt": bad}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:  # rejected by the node's own validation
            urllib.request.urlopen(req, timeout=30)
        assert "backend must be one of" in e.value.read().decode()
        req = urllib.request.Request(url + "/prompt", data=json.dumps({"prompt": prompt, "client_id": "t"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            prompt_id = json.loads(r.read())["prompt_id"]
        deadline = time.time() + 300
        while True:
            hist = get(f"/history/{prompt_id}")
            if prompt_id in hist:
                break
            assert proc.poll() is None and time.time() < deadline
            time.sleep(1)
        entry = hist[prompt_id]
        assert entry["status"]["status_str"] == "success", entry["status"]
        out = entry["outputs"]
        assert out["10"]["text"][0].startswith("AR ") and json.loads(out["10"]["specar_stats"][0])["nfe"] >= 1
        assert out["20"]["images"] and out["30"]["images"]  # the image and the heatmap previews
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_renders_stats(tmp_path, comfy):
    # lay out the file as ComfyUI serves it (extensions/<pack>/specar.js next to scripts/app.js)
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(
        "export const app = { registerExtension(e) { globalThis.registered = e; } };\n")
    ext_dir = tmp_path / "extensions" / "specar"
    ext_dir.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "web", "specar.js"), ext_dir / "specar.js")
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    _, ui = execute(v1.SpecARSampler, model=model, **{**BASE, "backend": "sjd_pac"})
    (tmp_path / "message.json").write_text(json.dumps(ui))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
await import("./extensions/specar/specar.js");
const ext = globalThis.registered;
function NodeType() {}
NodeType.prototype.onExecuted = function () { this.calledOriginal = true; };
await ext.beforeRegisterNodeDef(NodeType, { name: "SpecARSampler" });
const other = function () {};
await ext.beforeRegisterNodeDef(other, { name: "KSampler" });
const node = new NodeType();
Object.assign(node, {
  widgets: [], size: [300, 200],
  addWidget(type, name, value, cb, options) { const w = { type, name, value, options }; this.widgets.push(w); return w; },
  computeSize() { return [320, 260]; },
  setSize(s) { this.size = s; },
  setDirtyCanvas() {},
});
const message = JSON.parse(readFileSync("message.json", "utf8"));
node.onExecuted(message);
node.onExecuted(message);
console.log(JSON.stringify({ widgets: node.widgets, original: node.calledOriginal, size: node.size,
                             other: other.prototype.onExecuted === undefined }));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["original"] and res["other"] and res["size"] == [320, 260]
    assert len(res["widgets"]) == 1 and res["widgets"][0]["serialize"] is False
    text = res["widgets"][0]["value"]
    assert text.startswith("AR 16 steps -> SJD_PAC") and "step compression" in text and "mean accepted length" in text
