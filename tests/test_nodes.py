"""ComfyUI nodes without ComfyUI: schemas (V1 and V3), example workflows, execution of the API-format
workflows through the node classes with stubbed ComfyUI modules, the nodes' own validation,
cancellation, the model cache. The stubs live in tests/comfy_stubs.py and are put in sys.modules
with monkeypatch, so they are gone after each test (no conftest). One opt-in test starts a real
ComfyUI server: set SPECAR_COMFYUI to a ComfyUI checkout (and SPECAR_COMFYUI_PYTHON to its Python,
if not this one)."""
import asyncio
import glob
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import specar
from specar.nodes import core, layouts, models, report, spec, v1, v3, widgets
from specar.samplers import backends
from specar.samplers.backends import SCHEMAS
from specar.testing import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "example_workflows")
CORE_NODES = {"PreviewImage": {"images": "IMAGE"}, "SaveImage": {"images": "IMAGE"}}
FRONTEND_ONLY = {"Note", "MarkdownNote"}  # virtual nodes of the ComfyUI frontend (not in API format)
CONTROL_AFTER_GENERATE = ("fixed", "increment", "decrement", "randomize")  # the frontend's seed control values


def param_names(backend):
    return [p.name for p in SCHEMAS[backend].params]

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

    def fake_load_model(name_or_path, device=None, dtype=None, **options):
        state["loaded"].append((name_or_path, device, dtype))
        state["options"] = options
        return tiny_model(16, (4, 4), seed=0, row_end=True)

    monkeypatch.setattr(models, "load_model", fake_load_model)
    monkeypatch.setattr(models, "_hooked", [])
    models.free_models()
    state["mm"] = sys.modules["comfy.model_management"]
    state["models_dir"] = models_dir
    yield state
    models.free_models()


def flavours():
    """v1: INPUT_TYPES classes; v3: current ComfyUI (DynamicCombo); v3-flat: V3 without DynamicCombo."""
    return ["v1", "v3", "v3-flat"]


def node_classes(flavour):
    if flavour == "v1":
        return dict(v1.NODE_CLASS_MAPPINGS)
    return {cls.__name__: cls for cls in v3.build_nodes(stubs.make_io(with_dynamic_combo=flavour == "v3"))}


def is_dynamic(cls) -> bool:
    return any(kind == "COMFY_DYNAMICCOMBO_V3" for kind, _ in cls.INPUT_TYPES()["required"].values())


def as_comfy_passes(cls, inputs: dict) -> dict:
    """Inputs as ComfyUI hands them to a node: DynamicCombo keys nested (build_nested_inputs), a
    DynamicCombo whose value is none of its options dropped."""
    if not is_dynamic(cls):
        return dict(inputs)
    req = cls.INPUT_TYPES()["required"]
    out = {k: v for k, v in inputs.items() if "." not in k}
    for name, (kind, opts) in req.items():
        if kind == "COMFY_DYNAMICCOMBO_V3" and name in inputs:
            option = next((o for o in opts["options"] if o["key"] == inputs[name]), None)
            del out[name]
            if option is not None:
                out[name] = {name: inputs[name], **{sub: inputs.get(f"{name}.{sub}")
                                                    for sub in option["inputs"].get("required", {})}}
    return out


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


def comfy_validation_errors(cls, values: dict) -> list:
    """The inputs ComfyUI's validation (execution.validate_inputs) files an error against, one per
    input, for API-format `values`: a missing required widget, a combo value not offered, a number
    out of range (skipped for the inputs the node's validate function names), then the validate
    function's verdict filed against each input it names. A DynamicCombo contributes its chosen
    option's inputs as "<name>.<input>" and disappears when its value is none of the options."""
    fn = validate_fn(cls)
    named = [] if fn is None else [p for p in inspect.signature(fn).parameters if p != "cls"]
    expanded, types = {}, cls.INPUT_TYPES()
    optional = set(types.get("optional", {}))
    for name, (kind, opts) in {**types["required"], **types.get("optional", {})}.items():
        if kind == "COMFY_DYNAMICCOMBO_V3":
            option = next((o for o in opts["options"] if o["key"] == values.get(name)), None)
            if option is not None:
                expanded[name] = ([o["key"] for o in opts["options"]], {})
                for sub, spec_ in option["inputs"].get("required", {}).items():
                    expanded[f"{name}.{sub}"] = spec_
        else:
            expanded[name] = (kind, opts)
    bad = []
    for name, (kind, opts) in expanded.items():
        if name in named or not (isinstance(kind, list) or kind in ("INT", "FLOAT", "BOOLEAN", "STRING", "COMBO")):
            continue  # checked by the node's function, or a socket
        if name not in values:
            if name not in optional:
                bad.append(name)
        elif isinstance(values[name], list):
            continue  # linked to another node's output
        elif not widget_values_ok(kind, opts, values[name]):
            bad.append(name)
    if fn is not None:
        # execution.validate_inputs: the named inputs ComfyUI has (valid_inputs: a DynamicCombo whose value
        # is none of its options is gone), then build_nested_inputs, which adds a dict for every DynamicCombo
        # left, named or not, holding only the named values (None for the rest); the verdict is filed
        # against each named input ComfyUI had
        filtered = {k: v for k, v in values.items() if k in named and k in expanded}
        passed = {k: v for k, v in filtered.items() if "." not in k}
        for name, (kind, opts) in {**types["required"], **types.get("optional", {})}.items():
            option = kind == "COMFY_DYNAMICCOMBO_V3" and next(
                (o for o in opts["options"] if o["key"] == values.get(name)), None)
            if option:
                passed[name] = {name: filtered.get(name), **{sub: filtered.get(f"{name}.{sub}")
                                                             for sub in option["inputs"].get("required", {})}}
        verdict = fn(**passed)  # a DynamicCombo the function does not name: TypeError, as in ComfyUI
        if verdict is not True:
            bad += list(filtered)
    return bad


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
        if flavour != "v1":
            cls.GET_SCHEMA()  # ids unique across inputs and outputs, constructors accept our keywords
        assert cls.CATEGORY == "SpecAR" and cls.DESCRIPTION
        assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS) >= 1
        assert all(t in socket_types for t in cls.RETURN_TYPES) and all(cls.OUTPUT_TOOLTIPS)
        inputs = cls.INPUT_TYPES()
        assert set(inputs) <= {"required", "optional", "hidden"}  # hidden: an output node's prompt, extra_pnginfo
        # optional: only the inputs added after 0.1 (API prompts saved before them stay valid)
        added = {"SpecARModelLoader": ["resolution", "offload"], "SpecARSampler": ["compare_with_ar", "compile"]}
        assert list(inputs.get("optional", {})) == added.get(name, [])
        for iname, (kind, opts) in {**inputs["required"], **inputs.get("optional", {})}.items():
            assert opts.get("tooltip"), f"{name}.{iname} has no tooltip"
            assert isinstance(kind, list) or kind in {"INT", "FLOAT", "BOOLEAN", "STRING", "COMBO",
                                                      "COMFY_DYNAMICCOMBO_V3"} | socket_types
            if kind in ("INT", "FLOAT"):
                assert opts["min"] <= opts["max"]
            if "default" in opts:
                assert widget_values_ok(kind, opts, opts["default"]), f"{name}.{iname} default {opts['default']!r}"
    sampler = classes["SpecARSampler"]
    req = sampler.INPUT_TYPES()["required"]
    backend = req["backend"]
    if is_dynamic(sampler):  # each option carries its backend's inputs, checked like the others
        options = backend[1]["options"]
        assert [o["key"] for o in options][0] == "auto" and sorted(o["key"] for o in options) == sorted(SCHEMAS)
        for o in options:
            for iname, (kind, opts) in o["inputs"].get("required", {}).items():
                assert opts.get("tooltip") and iname in param_names(o["key"])
                if "default" in opts:
                    assert widget_values_ok(kind, opts, opts["default"]), (o["key"], iname)
        req = v1.input_types(models.sampler_spec())["required"]  # the flat view: defaults below
    else:
        assert (backend[0] if flavour == "v1" else backend[1]["options"]) == list(SCHEMAS)
    assert req["seed"][1]["control_after_generate"] and req["seed"][1]["max"] == 2**64 - 1
    for b, schema in SCHEMAS.items():  # flat layout: every backend's own inputs, with its defaults
        for p in schema.params:
            kind, opts = req[f"{b}_{p.name}"]
            assert opts["default"] == p.default or (p.default == "" and opts["default"] == spec.BESIDE_MODEL), (b, p)
    assert req["guidance"][1]["default"] == "model default" and req["cfg_scale"][1]["min"] == 0.0
    for cls in classes.values():  # ComfyUI checks the inputs itself: files each bad value once, on its input
        fn = validate_fn(cls)  # only the switches: ComfyUI passes every DynamicCombo to the function
        switches = ["backend", "guidance"] if flavour == "v3" else ["backend"]
        assert fn is None or [p for p in inspect.signature(fn).parameters if p != "cls"] == switches
    assert sampler.OUTPUT_NODE and sampler.RETURN_NAMES == ("image", "tokens", "stats", "acceptance_heatmap")
    assert sampler.RETURN_TYPES == ("IMAGE", "SPECAR_TOKENS", "STRING", "IMAGE")
    assert classes["SpecARModelLoader"].RETURN_TYPES == ("SPECAR_MODEL",)
    assert classes["SpecARModelLoader"].RETURN_NAMES == ("model",)


def test_dynamic_combo_options_carry_the_flat_inputs(comfy):
    flat = v1.SpecARSampler.INPUT_TYPES()["required"]
    dynamic = node_classes("v3")["SpecARSampler"].INPUT_TYPES()["required"]
    assert [k for k in dynamic if k not in ("model",)] == ["prompt", "negative_prompt", "seed", "backend", "guidance",
                                                          "temperature", "top_p", "batch_size", "preview"]
    for switch, prefix in (("backend", True), ("guidance", False)):
        for option in dynamic[switch][1]["options"]:
            for sub, (kind, opts) in option["inputs"].get("required", {}).items():
                fkind, fopts = flat[f"{option['key']}_{sub}" if prefix else sub]
                assert (kind == fkind) or (kind == "COMBO" and opts["options"] == fkind), (switch, sub)
                for key in ("default", "min", "max", "tooltip"):
                    assert opts.get(key) == fopts.get(key), (switch, option["key"], sub, key)


def test_v1_and_v3_schemas_agree(comfy):
    a, b = node_classes("v1"), node_classes("v3-flat")
    for name in a:
        ta, tb = a[name].INPUT_TYPES(), b[name].INPUT_TYPES()
        ta.pop("hidden", None), tb.pop("hidden", None)  # V3 adds an output node's hidden inputs itself
        assert {k: list(v) for k, v in ta.items()} == {k: list(v) for k, v in tb.items()}
        ia, ib = {**ta["required"], **ta.get("optional", {})}, {**tb["required"], **tb.get("optional", {})}
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


def test_sampler_widgets_follow_backend_schemas(monkeypatch):
    fake = backends.BackendSchema("fake", "Fake-Spec", "a backend added later", params=(
        backends.Param("window", 8, "drafts per forward", lo=1, hi=32, paper="Fake paper: 8"),
        backends.Param("lossy", False, "relaxed acceptance (lossy)"),
        backends.Param("delta", 0.1, "relaxation cap", lo=0.0, hi=1.0),
        backends.Param("variant", "tree", "how candidates are arranged", choices=("tree", "chain"))))
    monkeypatch.setitem(SCHEMAS, "fake", fake)
    req = v1.input_types(spec.sampler_spec())["required"]
    assert "fake" in req["backend"][0]
    kind, opts = req["fake_window"]
    assert kind == "INT" and (opts["default"], opts["min"], opts["max"]) == (8, 1, 32)  # a real value, no sentinel
    assert opts["tooltip"].startswith("Fake-Spec: drafts per forward. Default 8; Fake paper: 8")
    assert req["fake_lossy"][0] == "BOOLEAN" and req["fake_delta"][0] == "FLOAT" and req["fake_variant"][0] == [
        "tree", "chain"]
    assert req["sjd_pac_window"][1]["default"] == SCHEMAS["sjd_pac"].param("window").default
    assert req["sjd_window"][1]["default"] == SCHEMAS["sjd"].param("window").default
    # the three layouts of the same choice read alike
    flat = {"backend": "fake", "fake_window": 4, "fake_lossy": True, "sjd_window": 9, "guidance": "model default"}
    nested = {"backend": {"backend": "fake", "window": 4, "lossy": True}, "guidance": {"guidance": "model default"}}
    for values in (flat, nested):
        got = layouts.sampler_settings(values)
        assert (got.backend, got.params, got.cfg_scale, got.top_k) == ("fake", {"window": 4, "lossy": True}, None, None)
    custom = layouts.sampler_settings({"backend": "sjd", "guidance": "custom", "cfg_scale": 0.0, "top_k": 0})
    assert (custom.cfg_scale, custom.top_k) == (0.0, 0)  # custom top_k 0 = all tokens (no top-k), not None (the model's)
    # SpecAR 0.1 API prompts: shared names, window 0 / cfg_scale -1 / top_k 0 = the default
    legacy = layouts.sampler_settings({"backend": "sjd_pac", "window": 0, "tree_depth": 2, "init": "random",
                                    "cfg_scale": -1.0, "top_k": 0})
    assert (legacy.params, legacy.cfg_scale, legacy.top_k) == ({"tree_depth": 2, "init": "random"}, None, None)
    legacy = layouts.sampler_settings({"backend": "sjd", "window": 8, "tree_depth": 2, "cfg_scale": 2.0, "top_k": 7})
    assert (legacy.params, legacy.cfg_scale, legacy.top_k) == ({"window": 8}, 2.0, 7)
    with pytest.raises(ValueError, match="backend must be one of ar, .*fake; got 'turbo'"):
        layouts.sampler_settings({"backend": "turbo"})


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
    assert models.resolve(m1) is models.resolve(m2) and len(comfy["loaded"]) == 1  # cached across runs
    assert isinstance(m1, models.ModelHandle)  # ComfyUI caches the handle, not the model
    execute(loader, model="janus-pro-1b", device="cpu", dtype="bfloat16")
    assert comfy["loaded"][-1] == (os.path.join(comfy["models_dir"], "specar", "janus-pro-1b"), "cpu", "bfloat16")
    comfy["mm"].unload_all_models()  # ComfyUI's "unload models" frees ours too
    assert not models._cache and comfy.get("unloaded") == 1
    execute(loader, model="demo", device="auto", dtype="auto")
    assert len(comfy["loaded"]) == 3

    assert comfy_validation_errors(loader, dict(model="demo", device="auto", dtype="auto")) == []
    assert comfy_validation_errors(loader, dict(model="nope", device="tpu", dtype="auto")) == ["model", "device"]
    with pytest.raises(ValueError, match=r"model must be one of demo, emu3-gen, janus-pro-1b; got 'nope'"):
        execute(loader, model="nope", device="auto", dtype="auto")
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


def read_ui_values(cls, widgets_values: list, where: str) -> dict:
    """A UI-format node's widgets_values read as the ComfyUI frontend reads them for this class
    (positional: a DynamicCombo's key followed by its chosen option's values, the seed by its
    control value), each checked against its input: {API input name: value}."""
    values, out, types = list(widgets_values), {}, cls.INPUT_TYPES()
    for name, (kind, opts) in {**types["required"], **types.get("optional", {})}.items():  # the frontend's order
        if not (isinstance(kind, list) or kind in ("INT", "FLOAT", "BOOLEAN", "STRING", "COMBO",
                                                   "COMFY_DYNAMICCOMBO_V3")):
            continue  # a socket
        assert values, f"{where}: no value for {name}"
        value = values.pop(0)
        if kind == "COMFY_DYNAMICCOMBO_V3":
            option = next((o for o in opts["options"] if o["key"] == value), None)
            assert option is not None, f"{where}: {name} = {value!r} is not an option"
            out[name] = value
            for sub, (k, o) in option["inputs"].get("required", {}).items():
                assert values, f"{where}: no value for {name}.{sub}"
                out[f"{name}.{sub}"] = values.pop(0)
                assert widget_values_ok(k, o, out[f"{name}.{sub}"]), f"{where}: {name}.{sub} = {out[f'{name}.{sub}']!r}"
            continue
        assert widget_values_ok(kind, opts, value), f"{where}: {name} = {value!r}"
        out[name] = value
        if opts.get("control_after_generate"):
            assert values.pop(0) in CONTROL_AFTER_GENERATE
    assert not values, f"{where}: extra widget values {values}"
    return out


def test_example_workflows_reference_real_nodes_with_valid_values():
    classes = node_classes("v3")  # the layout of current ComfyUI (DynamicCombo)
    for path in _ui_files():
        name = os.path.basename(path)
        wf = _load(path)
        nodes = {n["id"]: n for n in wf["nodes"]}
        assert len(nodes) == len(wf["nodes"]) and wf["last_node_id"] >= max(nodes)
        assert {"SpecARModelLoader", "SpecARSampler"} <= {n["type"] for n in wf["nodes"]}
        api = _load(os.path.join(EXAMPLES, "api", name))
        for n in wf["nodes"]:
            assert n["type"] in classes or n["type"] in CORE_NODES or n["type"] in FRONTEND_ONLY, n["type"]
            if n["type"] not in classes:
                continue
            read = read_ui_values(classes[n["type"]], n["widgets_values"], f"{name}: {n['type']}")
            if n["type"] == "SpecARModelLoader":
                assert read["model"] == "demo", f"{name}: examples use the embedded demo model"
            # the API-format twin has the same values
            assert {k: v for k, v in api[str(n["id"])]["inputs"].items() if not isinstance(v, list)} == read
            assert comfy_validation_errors(classes[n["type"]], read) == []
            if n["type"] == "SpecARSampler":
                assert core.sampler_error(read) is None
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
    from specar.nodes import workflows
    for name, desc in workflows.WORKFLOWS.items():
        assert _load(os.path.join(EXAMPLES, f"{name}.json")) == json.loads(json.dumps(workflows.build_ui(desc)))
        assert _load(os.path.join(EXAMPLES, "api", f"{name}.json")) == json.loads(json.dumps(workflows.build_api(desc)))
    backends = [n["inputs"]["backend"] for n in _load(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json")).values()
                if n["class_type"] == "SpecARSampler"]
    assert backends == list(SCHEMAS)  # every backend, ADT-Tree's lossy relaxed mode off
    side = _load(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json"))
    assert not any(n["inputs"].get("backend.relaxed") for n in side.values())
    saved = [n for n in side.values() if n["class_type"] == "SaveImage"]
    assert len(saved) == len(SCHEMAS) and all(n["inputs"]["filename_prefix"].startswith("specar/") for n in saved)


def run_api_workflow(prompt, classes):
    """Validate and execute an API-format prompt node by node, as ComfyUI's executor does (converted
    to the flat layout first when the classes have no DynamicCombo)."""
    from specar.nodes import workflows
    if not is_dynamic(classes["SpecARSampler"]):
        prompt = layouts.to_flat(prompt)
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
            widgets = {k: v for k, v in node["inputs"].items() if not isinstance(v, list)}
            assert comfy_validation_errors(cls, widgets) == []
            outputs[nid], uis[nid] = execute(cls, **as_comfy_passes(cls, args))
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
            label = SCHEMAS[s["backend"]].label
            assert s["summary"].startswith(f"{label}: 16 tokens in {s['nfe'] + 1} forward passes")
            assert uis[nid]["text"] == [s["summary"]] and s["backend_label"] == label
            assert json.loads(uis[nid]["specar_stats"][0]) == s
            assert tokens["tokens"].shape == (1, 4, 4)
        assert comfy["progress"] and comfy["progress"][-1][0] == comfy["progress"][-1][1]
        assert len(comfy["loaded"]) == 1  # one model for all samplers, loaded once
    # the same seed gives the same tokens whichever flavour of node ran it
    side = _load(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json"))
    out_a, _ = run_api_workflow(side, classes)
    out_b, _ = run_api_workflow(side, classes)
    for nid in side:
        if side[nid]["class_type"] == "SpecARSampler":
            assert torch.equal(out_a[nid][1]["tokens"], out_b[nid][1]["tokens"])


# ---------------------------------------------------------------------------------------------
# validation, cancellation, decode

def sampler_values(**changes):
    from specar.nodes import workflows
    return {**workflows.sampler_values("x", 0, backend="sjd"), **changes}


def api_inputs(cls, flat: dict) -> dict:
    """Flat sampler values as an API prompt for this class's layout ("backend.window" with DynamicCombo;
    a value that is none of a switch's options is kept, without inputs)."""
    if not is_dynamic(cls):
        return dict(flat)
    out = {}
    for w in spec.sampler_spec().inputs:
        if isinstance(w, widgets.Switch):
            key = flat[w.name]
            out[w.name] = key
            for sub in w.options.get(key, []):
                out[f"{w.name}.{sub.name}"] = flat[w.flat_name(key, sub)]
        elif w.is_widget:
            out[w.name] = flat[w.name]
    return out


def dynamic_name(flat_name: str, backend: str) -> str:
    """The API name of a flat input in the DynamicCombo layout."""
    if flat_name.startswith(f"{backend}_"):
        return "backend." + flat_name[len(backend) + 1:]
    return {"cfg_scale": "guidance.cfg_scale", "top_k": "guidance.top_k"}.get(flat_name, flat_name)


def run_sampler_node(cls, model, flat: dict):
    """Execute the sampler class with these values as ComfyUI would pass them (layout of the class)."""
    return execute(cls, model=model, **as_comfy_passes(cls, api_inputs(cls, flat)))


BASE = sampler_values()
BACKEND_CHOICES = ", ".join(SCHEMAS)


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("change, bad_input, message", [
    ({"backend": "turbo"}, "backend", f"backend must be one of {BACKEND_CHOICES}; got 'turbo'"),
    ({"sjd_init": "diagonal"}, "sjd_init", "sjd_init must be one of random, repeat_left"),
    ({"backend": "scd", "scd_coupling": "strong"}, "scd_coupling", "scd_coupling must be one of maximal, gumbel"),
    ({"sjd_window": 999}, "sjd_window", "sjd_window must be in [1, 128], got 999"),
    ({"seed": -1}, "seed", "seed must be in [0, 18446744073709551615]"),
    ({"top_p": 0.0}, "top_p", "top_p must be in [0.01, 1.0]"),
    ({"temperature": float("nan")}, "temperature", "temperature must be a finite number"),
    ({"backend": "sjd_pac", "sjd_pac_continuation": "yes"}, "sjd_pac_continuation",
     "sjd_pac_continuation must be true or false"),
    ({"guidance": "custom", "cfg_scale": -1.0}, "cfg_scale", "cfg_scale must be in [0.0, 100.0], got -1.0"),
    ({"guidance": "always"}, "guidance", "guidance must be one of model default, custom"),
    ({"backend": "hawk", "hawk_heads": "elsewhere"}, "hawk_heads", "hawk_heads must be one of (beside the model)"),
    # limits between inputs: not a widget range, so ComfyUI files nothing; the node says it once, when it runs
    ({"backend": "sjd_pac", "sjd_pac_window": 4, "sjd_pac_tree_depth": 5}, None,
     "tree_depth must be an int in [1, 4], got 5"),
])
def test_bad_values_give_one_error_on_the_right_input(flavour, change, bad_input, message, comfy):
    classes = node_classes(flavour)
    sampler, loader = classes["SpecARSampler"], classes["SpecARModelLoader"]
    values = {**BASE, **change}
    if is_dynamic(sampler) and bad_input:
        bad_input = dynamic_name(bad_input, values["backend"])
        message = message.split("; got")[0] if bad_input in ("backend", "guidance") else message  # value dropped
        message = message.replace(f"{values['backend']}_", "", 1)  # nested inputs keep their own names
        # ComfyUI drops a switch whose value is none of its options, so the verdict is filed against the
        # other switch
        bad_input = {"backend": "guidance", "guidance": "backend"}.get(bad_input, bad_input)
    assert comfy_validation_errors(sampler, api_inputs(sampler, values)) == ([bad_input] if bad_input else [])
    model, = execute(loader, model="demo", device="auto", dtype="auto")[0]
    with pytest.raises(ValueError) as e:
        run_sampler_node(sampler, model, values)
    assert message in str(e.value)
    assert comfy_validation_errors(sampler, api_inputs(sampler, BASE)) == [] and core.sampler_error(BASE) is None
    # the inputs of backends not chosen are not the node's concern when it runs
    assert core.sampler_error({**BASE, "backend": "ar", "sjd_pac_tree_depth": 100}) is None


def test_a_tree_too_big_for_the_model_names_its_parameters(comfy):
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    limit = models.resolve(model).max_positions
    assert limit is not None
    values = sampler_values(backend="hawk", hawk_node_budget=min(512, limit + 8))
    with pytest.raises(ValueError) as e:
        execute(v1.SpecARSampler, model=model, **values)
    assert "node_budget=" in str(e.value) and "allows at most" in str(e.value) and "lower" in str(e.value)


def test_speedup_is_measured_against_ar_in_the_same_execution(comfy):
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    _, ui = execute(v1.SpecARSampler, model=model, **sampler_values(backend="ar"))
    assert ui["text"][0].startswith("AR (baseline): 16 tokens in 16 forward passes")
    # an AR run of an earlier execution is never the reference: no speed-up without compare_with_ar
    _, ui = execute(v1.SpecARSampler, model=model, **sampler_values(backend="sjd_pac"))
    assert ui["text"][0].startswith("SJD-PAC: 16 tokens in ") and "turn on compare_with_ar" in ui["text"][0]
    assert "speedup_vs_ar" not in json.loads(ui["specar_stats"][0])
    calls = []
    real_generate = core.generate

    def recording_generate(model, prompt, backend="sjd", **kw):
        # the node passes its validated BackendConfig (the compare run: the name "ar")
        calls.append((getattr(backend, "name", backend), kw["seed"], kw["batch_size"], kw["cfg_scale"], kw["top_k"]))
        return real_generate(model, prompt, backend=backend, **kw)

    core.generate = recording_generate
    try:
        _, ui = execute(v1.SpecARSampler, model=model, **sampler_values(backend="sjd_pac", batch_size=2, seed=5,
                                                                        compare_with_ar=True))
    finally:
        core.generate = real_generate
    assert [c[0] for c in calls] == ["sjd_pac", "ar"] and calls[0][1:] == calls[1][1:] == (5, 2, None, None)
    s = json.loads(ui["specar_stats"][0])
    assert f"{s['ar_latency_s'] / s['latency_s']:.2f}x AR's {s['ar_latency_s']:.2f} s measured in this run" in ui["text"][0]
    assert abs(s["speedup_vs_ar"] - s["ar_latency_s"] / s["latency_s"]) < 1e-9
    # batch 2: tokens and forward passes summed over the images, the ratio of the sums
    tokens, forwards = 2 * 16, sum(n + 1 for n in s["steps"])
    assert (s["tokens_total"], s["forwards_total"]) == (tokens, forwards)
    assert f"2 images, {tokens} tokens in {forwards} forward passes summed over the images " \
           f"({tokens / forwards:.1f}x fewer than AR)" in ui["text"][0]


def test_a_lossy_run_says_so_and_is_never_called_faster():
    from specar.samplers.stats import GenerationStats
    fields = {f: None for f in GenerationStats.__dataclass_fields__}
    base = dict(fields, backend="adt_tree", batch=1, image_tokens=16, nfe=3, steps=[3], latency_s=0.1, lossy=True,
                params={}, accepted_length_histogram={})
    lossy = GenerationStats(**base)
    ar = GenerationStats(**dict(base, backend="ar", nfe=15, steps=[15], latency_s=1.0, lossy=False))
    text = report.summary(lossy, ar)
    assert "LOSSY" in text.split(":")[0] and "faster" not in text and "not comparable" in text
    assert "faster" in report.summary(GenerationStats(**dict(base, lossy=False)), ar)


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
    with pytest.raises(ValueError, match=r"offload 'auto' .* is for transformers-format models .*'.*fake-gen' is "
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
        ("demo", "model default", "auto", "offload 'auto' (accelerate device_map) is for transformers-format"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            load(model, resolution, offload)
    assert comfy_validation_errors(loader, dict(model="demo", device="auto", dtype="auto", resolution="640x480",
                                                offload="none")) == ["resolution"]


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


def test_out_of_memory_names_what_to_lower_and_leaves_the_model_usable(comfy, monkeypatch):
    handle, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    model = models.resolve(handle)
    values = sampler_values(backend="sjd_pac", sjd_pac_window=8, batch_size=3, seed=1)
    reference = execute(v1.SpecARSampler, model=handle, **values)[0]
    real_forward = type(model).forward

    def oom(self, *a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(type(model), "forward", oom)
    with pytest.raises(RuntimeError) as e:
        execute(v1.SpecARSampler, model=handle, **values)
    msg = str(e.value)
    assert "out of GPU memory" in msg and "batch_size (now 3)" in msg and "window=8" in msg and "still loaded" in msg
    monkeypatch.setattr(type(model), "forward", real_forward)
    again = execute(v1.SpecARSampler, model=handle, **values)[0]
    assert torch.equal(again[1]["tokens"], reference[1]["tokens"])


def test_drafter_folders_are_listed_and_resolved(comfy):
    base = os.path.join(comfy["models_dir"], spec.DRAFTER_FOLDER)
    for name, kind in (("my-hawk-heads", "hawk"), ("my-eagle", "eagle"), ("broken", None)):
        os.makedirs(os.path.join(base, name))
        if kind:
            with open(os.path.join(base, name, "drafter.json"), "w") as f:
                json.dump({"kind": kind}, f)
    req = v1.SpecARSampler.INPUT_TYPES()["required"]
    assert req["hawk_heads"][0] == [spec.BESIDE_MODEL, "my-hawk-heads"]
    assert req["adt_tree_drafter"][0] == [spec.BESIDE_MODEL, "my-eagle"]
    settings, config = core.backend_config(sampler_values(backend="hawk", hawk_heads="my-hawk-heads"))
    assert config.params()["heads"] == os.path.join(base, "my-hawk-heads")
    settings, config = core.backend_config(sampler_values(backend="hawk"))
    assert config.params()["heads"] == ""  # beside the model


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("where", ["progress_hook", "interrupt_check"])
def test_cancel_stops_generation_and_model_stays_usable(flavour, where, comfy):
    classes = node_classes(flavour)
    sampler = classes["SpecARSampler"]
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    args = {**BASE, "backend": "sjd_pac", "sjd_pac_window": 4, "sjd_pac_tree_depth": 2, "seed": 3}
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
    img = report.heatmap([[0, 1, 1], [1, 2, 2]], size=(4, 6))
    assert img.shape == (4, 6, 3) and float(img.min()) >= 0 and float(img.max()) <= 1
    flat = report.heatmap([[0, 1], [2, 3]])
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
    monkeypatch.setattr(models, "load_model", lambda name, device=None, dtype=None: model)
    classes = node_classes("v3")
    prompt = _load(os.path.join(EXAMPLES, "api", "SpecAR demo - auto.json"))
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


def stop_process(proc):
    """Stop a server started by a test: terminate, then kill if it has not exited in 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


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
        prompt = _load(api_twin("SpecAR demo - auto.json", info))
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
        stats = json.loads(out["10"]["specar_stats"][0])
        label = SCHEMAS[prompt["10"]["inputs"]["backend"]].label  # the demo's backend, e.g. "SJD-PAC"
        assert stats["backend_label"] == label and out["10"]["text"][0].startswith(label) and stats["nfe"] >= 1
        assert out["20"]["images"] and out["30"]["images"]  # the image and the heatmap previews
    finally:
        stop_process(proc)
        log.close()


def api_twin(name: str, object_info: dict) -> str:
    """The API-format example for this server's sampler layout: DynamicCombo ("backend.window") or flat."""
    flat = "sjd_pac_window" in object_info["SpecARSampler"]["input"]["required"]
    return os.path.join(EXAMPLES, "api", *(["flat"] if flat else []), name)


LEGACY_LAYOUT = ["prompt", "negative_prompt", "seed", "control_after_generate", "backend", "cfg_scale", "temperature",
                 "top_k", "top_p", "window", "init", "coupling", "coupling_strength", "tree_depth", "tree_width",
                 "continuation", "batch_size"]  # a SpecAR 0.1 sampler's widgets_values, in order


def _effective(settings):
    """SamplerSettings with every parameter of its backend (the default where none was given)."""
    params = {p.name: settings.params.get(p.name, p.default) for p in SCHEMAS[settings.backend].params}
    return settings.backend, params, settings.cfg_scale, settings.top_k


@pytest.mark.skipif(not os.environ.get("SPECAR_COMFYUI"), reason="set SPECAR_COMFYUI to a ComfyUI checkout")
def test_real_frontend_loads_example_and_0_1_workflows(tmp_path):
    """In ComfyUI's own frontend (headless Chromium): the example workflows load with the values of their
    API twins (what app.graphToPrompt would queue), and SpecAR 0.1 workflows are migrated by web/specar.js
    to the values the server reads from the 0.1 layout, which the server accepts."""
    import urllib.request
    mspec = importlib.util.spec_from_file_location("specar_screenshot_nodes",
                                                   os.path.join(ROOT, "tests", "screenshot_nodes.py"))
    shots = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(shots)
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
                fe.load(_load(path))
                got = fe.read()["prompt"]
                with urllib.request.urlopen(url + "/object_info/SpecARSampler", timeout=10) as r:
                    want = _load(api_twin(os.path.basename(path), json.loads(r.read())))
                assert {k: (n["class_type"], n["inputs"]) for k, n in got.items()} == \
                    {k: (n["class_type"], n["inputs"]) for k, n in want.items()}, os.path.basename(path)
            for name in ("specar_0.1_side_by_side.json", "specar_0.1_custom_values.json"):
                ui = _load(os.path.join(ROOT, "tests", "data", name))
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


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_renders_stats(tmp_path, comfy):
    _web_harness(tmp_path)
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
    assert text.startswith("SJD-PAC: 16 tokens in") and "step compression" in text and "mean accepted length" in text
    assert "backend SJD-PAC" in text and "sampling: cfg" in text
    # the preview is sent upscaled (the frontend labels it 512x512): the statistics say the image's own size
    assert "image 4x4 px; live preview: the 4x4 image, shown upscaled to 512x512" in text


def _web_harness(tmp_path):
    """The extension laid out as ComfyUI serves it (extensions/<pack>/specar.js next to scripts/app.js)."""
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(
        "export const app = { registerExtension(e) { globalThis.registered = e; } };\n")
    ext_dir = tmp_path / "extensions" / "specar"
    ext_dir.mkdir(parents=True)
    for name in os.listdir(os.path.join(ROOT, "web")):  # ComfyUI serves the whole web folder
        shutil.copy(os.path.join(ROOT, "web", name), ext_dir / name)


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_migrates_legacy_workflows_and_shows_only_the_chosen_backend(tmp_path, comfy):
    _web_harness(tmp_path)
    required = v1.SpecARSampler.INPUT_TYPES()["required"]
    optional = v1.SpecARSampler.INPUT_TYPES().get("optional", {})
    (tmp_path / "node_def.json").write_text(json.dumps({"name": "SpecARSampler",
                                                        "input": {"required": required, "optional": optional}}))
    # a sampler node as SpecAR 0.1 saved it: 16 widgets, the seed's control value after the seed
    legacy = ["a cat", "", 11, "fixed", "sjd_pac", -1.0, 0.9, 0, 1.0, 0, "random", "maximal", 1.0, 2, 3, False, 2]
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    # the example workflow as current ComfyUI saves it (DynamicCombo), opened by a ComfyUI without it
    from specar.nodes import workflows
    ui = _load(os.path.join(EXAMPLES, "SpecAR - every backend side by side.json"))
    (tmp_path / "dynamic.json").write_text(json.dumps({str(n["id"]): n["widgets_values"] for n in ui["nodes"]
                                                        if n["type"] == "SpecARSampler"}))
    (tmp_path / "named.json").write_text(json.dumps({str(n["id"]): n for n in ui["nodes"] if n["type"] == "SpecARSampler"}))
    flat_api = layouts.to_flat(_load(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json")))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
await import("./extensions/specar/specar.js");
const mod = await import("./extensions/specar/specar_layouts.js");
const ext = globalThis.registered;
const def = JSON.parse(readFileSync("node_def.json", "utf8"));
function NodeType() {}
await ext.beforeRegisterNodeDef(NodeType, def);
function makeNode() {
  const node = new NodeType();
  node.size = [300, 900];
  // as the frontend builds it: one widget per input, the seed's control widget right after the seed
  node.widgets = Object.entries({ ...def.input.required, ...def.input.optional }).filter(([n, [k]]) => k !== "SPECAR_MODEL").flatMap(([name, [kind, opts]]) =>
    [{ name, type: Array.isArray(kind) ? "combo" : kind, value: opts.default, callback: null },
     ...(opts.control_after_generate ? [{ name: "control_after_generate", type: "combo", value: "randomize" }] : [])]);
  node.computeSize = function () { return [300, 20 * this.widgets.filter((w) => w.type !== "specar-hidden").length]; };
  node.setSize = function (s) { this.size = s; };
  node.setDirtyCanvas = function () {};
  node.addWidget = function (type, name, value, callback, options) {
    const w = { name, type, value, callback, options };
    this.widgets.push(w);
    return w;
  };
  node.title = "SpecAR Sampler - SJD-PAC";
  node.onNodeCreated();
  return node;
}
const shown = (n) => n.widgets.filter((w) => w.type !== "specar-hidden").map((w) => w.name);
const fresh = makeNode();
const first = shown(fresh);
const backend = fresh.widgets.find((w) => w.name === "backend");
backend.value = "hawk"; backend.callback("hawk");
const afterHawk = shown(fresh);
const titleAfterHawk = fresh.title;
const toggle = fresh.widgets.find((w) => w.name === "advanced inputs");
toggle.value = true; toggle.callback(true);
const afterAdvanced = shown(fresh);
toggle.value = false; toggle.callback(false);
fresh.title = "my hawk";
backend.value = "sjd"; backend.callback("sjd");
const renamedTitle = fresh.title;
backend.value = "hawk"; backend.callback("hawk");
fresh.onExecuted({ specar_stats: [JSON.stringify({ summary: "s", backend: "ar", params: {}, overhead_s: 2.0 })] });
fresh.onExecutionStart();
const statsDuringRun = fresh.widgets.find((w) => w.name === "specar_stats_view").value;
backend.value = "adt_tree"; backend.callback("adt_tree");
const shape = fresh.widgets.find((w) => w.name === "adt_tree_tree_shape");
const mode = fresh.widgets.find((w) => w.name === "adt_tree_candidate_mode");
mode.value = "topk";
shape.value = "best_first"; shape.callback("best_first");
const impliedMode = mode.value;
const guidance = fresh.widgets.find((w) => w.name === "guidance");
guidance.value = "custom"; guidance.callback("custom");
const afterCustom = shown(fresh);
const old = makeNode();
const legacyValues = JSON.parse(readFileSync("legacy.json", "utf8"));
// the frontend first puts the saved values into the widgets by position, then calls onConfigure
legacyValues.forEach((v, i) => { if (old.widgets[i]) old.widgets[i].value = v; });
old.onConfigure({ widgets_values: legacyValues });
old.onAfterGraphConfigured(); // after the whole graph: the migrated values go in again
const migrated = Object.fromEntries(old.widgets.map((w) => [w.name, w.value]));
const saved = JSON.parse(readFileSync("dynamic.json", "utf8"));
const dyn = {};
for (const [nid, values] of Object.entries(saved)) {
  const n = makeNode();
  n.onConfigure({ widgets_values: values });
  dyn[nid] = Object.fromEntries(n.widgets.map((w) => [w.name, w.value]));
}
// the same nodes with their values by name (properties.specar_inputs): the frontend first puts the saved
// values into the flat widgets by position (wrong places), the extension then applies them by name
const named = {};
const serialized = {};
for (const [nid, info] of Object.entries(JSON.parse(readFileSync("named.json", "utf8")))) {
  const n = makeNode();
  info.widgets_values.forEach((v, i) => { if (n.widgets[i]) n.widgets[i].value = v; });
  n.onConfigure(info);
  n.onAfterGraphConfigured();
  named[nid] = Object.fromEntries(n.widgets.map((w) => [w.name, w.value]));
  const o = { properties: {} };
  n.onSerialize(o);
  serialized[nid] = o.properties.specar_inputs;
}
console.log(JSON.stringify({ first, afterHawk, impliedMode, titleAfterHawk, afterAdvanced, renamedTitle, statsDuringRun, afterCustom, migrated, shownOld: shown(old), dyn, named, serialized,
  notes: mod.migrateLegacyValues([...JSON.parse(readFileSync("legacy.json", "utf8"))].map((v, i) => i === 5 ? 2.5 : v), []).notes }));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    default_backend = required["backend"][1]["default"]
    own = lambda b: [f"{b}_{p}" for p in param_names(b)]  # noqa: E731
    essential = lambda b: [f"{b}_{p}" for p in param_names(b) if not spec.is_advanced(b, p)]  # noqa: E731
    backend_inputs = lambda names: [n for n in names if n.startswith(tuple(f"{b}_" for b in SCHEMAS))]  # noqa: E731
    # a few essentials first; the advanced inputs on request
    assert backend_inputs(res["first"]) == essential(default_backend) and len(essential(default_backend)) <= 3
    assert "cfg_scale" not in res["first"] and "guidance" in res["first"]
    assert backend_inputs(res["afterHawk"]) == essential("hawk") != own("hawk")
    assert backend_inputs(res["afterAdvanced"]) == own("hawk")
    # the title follows the backend, unless the user renamed the node
    assert res["titleAfterHawk"] == "SpecAR Sampler - Hawk" and res["renamedTitle"] == "my hawk"
    assert res["statsDuringRun"] == "running..."  # the previous run's statistics are cleared
    # best_first needs sampled candidates: picking it sets candidate_mode (topk + best_first cannot be picked)
    assert res["impliedMode"] == "sampled"
    assert "cfg_scale" in res["afterCustom"] and "top_k" in res["afterCustom"]
    m = res["migrated"]
    assert (m["prompt"], m["seed"], m["backend"], m["temperature"], m["batch_size"]) == ("a cat", 11, "sjd_pac", 0.9, 2)
    assert m["guidance"] == "model default"  # cfg -1 and top_k 0 were the model's values
    assert (m["sjd_pac_tree_depth"], m["sjd_pac_tree_width"], m["sjd_pac_continuation"]) == (2, 3, False)
    assert m["sjd_pac_window"] == SCHEMAS["sjd_pac"].param("window").default  # window 0 = the backend's default
    # the inputs 0.1 did not have get their defaults back, not the values the frontend put there by position
    defaults = {name: opts.get("default") for name, (kind, opts) in required.items() if name != "model"}
    assert m["preview"] == defaults["preview"] and m["cfg_scale"] == defaults["cfg_scale"]
    others = [f"{b}_{p}" for b in SCHEMAS if b != "sjd_pac" for p in param_names(b)]  # not the chosen backend's
    assert others and {k: m[k] for k in others} == {k: defaults[k] for k in others}
    assert own("sjd_pac")[0] in res["shownOld"] and own("sjd")[0] not in res["shownOld"]
    assert res["notes"] and "top_k" in res["notes"][0]  # an explicit cfg with the model's top-k: said, not hidden
    assert set(res["dyn"]) == {k for k, n in flat_api.items() if n["class_type"] == "SpecARSampler"}
    for nid, got in res["dyn"].items():
        want = {k: v for k, v in flat_api[nid]["inputs"].items() if not isinstance(v, list)}
        assert {k: got[k] for k in want} == want, nid
    # by name: every flat input, the other backends' included, has its API twin's value (their defaults)
    ui_nodes = {str(n["id"]): n for n in ui["nodes"]}
    for nid, got in res["named"].items():
        want = {k: v for k, v in flat_api[nid]["inputs"].items() if not isinstance(v, list)}
        assert {k: got[k] for k in want} == want, nid
        assert res["serialized"][nid] == ui_nodes[nid]["properties"]["specar_inputs"], nid
    # what the browser migrates runs as the server reads the same SpecAR 0.1 values
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    values = {k: v for k, v in m.items() if k in required and k != "model"}
    old_values = dict(zip(["prompt", "negative_prompt", "seed"], legacy[:3]))
    old_values.update(zip(["backend", "cfg_scale", "temperature", "top_k", "top_p", "window", "init", "coupling",
                           "coupling_strength", "tree_depth", "tree_width", "continuation", "batch_size"], legacy[4:]))
    a = core.run_sampler(model, values)
    b = core.run_sampler(model, old_values)
    assert torch.equal(a[1]["tokens"], b[1]["tokens"])


def test_custom_top_k_0_means_all_tokens(comfy, monkeypatch):
    """The tooltip's "0 = all tokens" holds: custom top_k 0 reaches generate as 0 (no top-k), not as
    None, which is the model's recommended top-k (256 on the demo model: what it silently was)."""
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    seen, real_generate = [], core.generate
    monkeypatch.setattr(core, "generate", lambda *a, **kw: seen.append(kw["top_k"]) or real_generate(*a, **kw))
    values = sampler_values(backend="ar", guidance="custom", cfg_scale=2.0, top_k=0, seed=3)
    _, tokens, stats, _ = execute(v1.SpecARSampler, model=model, **values)[0]
    assert seen == [0]
    assert json.loads(stats)["sampling"]["top_k"] == "off"
    direct = specar.generate(models.resolve(model), "x", backend="ar", seed=3, cfg_scale=2.0, top_k=0)
    assert torch.equal(tokens["tokens"][0], direct.tokens)


@pytest.mark.parametrize("flavour", flavours())
def test_compile_input_reaches_generate_and_defaults_off(flavour, comfy, monkeypatch):
    """The sampler's compile input is what `generate` gets as compile= (False when an API prompt saved
    before the input existed leaves it out); compare_with_ar's AR run stays eager."""
    classes = node_classes(flavour)
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    seen, real_generate = [], core.generate

    def recording_generate(model, prompt, backend="sjd", compile=False, **kw):
        seen.append((getattr(backend, "name", backend), compile))
        return real_generate(model, prompt, backend=backend, **kw)  # the compiled step itself: test_compile.py

    monkeypatch.setattr(core, "generate", recording_generate)
    run_sampler_node(classes["SpecARSampler"], model, sampler_values(backend="sjd", compile=True, compare_with_ar=True))
    assert seen == [("sjd", True), ("ar", False)]
    seen.clear()
    cls = classes["SpecARSampler"]
    old = {k: v for k, v in api_inputs(cls, sampler_values(backend="sjd")).items()
           if k not in ("compile", "compare_with_ar")}
    execute(cls, model=model, **as_comfy_passes(cls, old))
    assert seen == [("sjd", False)]
    with pytest.raises(Exception, match="compile must be true or false, got 'yes'"):
        execute(v1.SpecARSampler, model=model, **sampler_values(compile="yes"))
