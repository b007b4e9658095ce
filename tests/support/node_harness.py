"""The node tests' harness (tests/test_nodes_*.py): ComfyUI without ComfyUI. Not a test.

The ComfyUI stand-ins of comfy_stubs.py go into sys.modules through the `comfy` fixture
(tests/conftest.py, with monkeypatch: gone after each test); the helpers here build the node classes
of each flavour (V1, V3, V3 without DynamicCombo), run them as ComfyUI's executor does, check values
as ComfyUI's validation does and read the example workflows."""
import glob
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import torch

from specar.model_loaders.tiny import tiny_model
from specar.nodes import layouts, models, spec, v1, v3, widgets
from specar.samplers.backends import SCHEMAS

from . import PACKAGE as ROOT
from . import comfy_stubs as stubs

EXAMPLES = os.path.join(ROOT, "example_workflows")
CORE_NODES = {"PreviewImage": {"images": "IMAGE"}, "SaveImage": {"images": "IMAGE"}}
FRONTEND_ONLY = {"Note", "MarkdownNote"}  # virtual nodes of the ComfyUI frontend (not in API format)
CONTROL_AFTER_GENERATE = ("fixed", "increment", "decrement", "randomize")  # the frontend's seed control values


def param_names(backend):
    return [p.name for p in SCHEMAS[backend].params]


def comfy_modules(monkeypatch, tmp_path):
    """The `comfy` fixture (tests/conftest.py): ComfyUI stand-ins in sys.modules (undone after the test);
    "demo" is a tiny random model."""
    state = {"interrupt": False, "progress": [], "loaded": []}
    models_dir = str(tmp_path / "models")
    for name, module in stubs.stub_modules(state, models_dir).items():
        monkeypatch.setitem(sys.modules, name, module)

    def fake_load_model(name_or_path, device=None, dtype=None, **options):
        state["loaded"].append((name_or_path, device, dtype))
        state["options"] = options
        model = tiny_model(16, (4, 4), seed=0, row_end=True)
        model.quantization = options.get("quantize", "none")  # as registry.load_model marks the model it loads
        return model

    monkeypatch.setattr(models, "load_model", fake_load_model)
    monkeypatch.setattr(models, "_hooked", [])
    models.free_models()
    state["mm"] = sys.modules["comfy.model_management"]
    state["models_dir"] = models_dir
    yield state
    models.free_models()


def flavours():
    """v1: INPUT_TYPES classes (ComfyUI without DynamicCombo, the floor 0.3.64); v3: ComfyUI with DynamicCombo."""
    return ["v1", "v3"]


def node_classes(flavour):
    if flavour == "v1":
        return dict(v1.NODE_CLASS_MAPPINGS)
    return {cls.__name__: cls for cls in v3.build_nodes(stubs.make_io())}


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


def comfy_validation_errors(cls, values: dict, unique_id=None, messages: list = None) -> list:
    """The inputs ComfyUI's validation (execution.validate_inputs) files an error against, one per
    input, for API-format `values`: a missing required widget, a combo value not offered, a number
    out of range (skipped for the inputs the node's validate function names), then the validate
    function's verdict filed against each input it names (its text appended to `messages`). A
    DynamicCombo contributes its chosen option's inputs as "<name>.<input>" and disappears when its
    value is none of the options. An on/off input takes any value (ComfyUI runs bool(value)).
    `unique_id`: the node's id, the hidden input a V1 function may name (V3: `cls.hidden.unique_id`)."""
    fn = validate_fn(cls)
    if hasattr(cls, "define_schema"):
        cls.hidden = SimpleNamespace(unique_id=unique_id, prompt=getattr(getattr(cls, "hidden", None), "prompt", None))
    # the function's positional inputs (inspect.getfullargspec(...).args, as ComfyUI reads them)
    named = [] if fn is None else [p for p in inspect.getfullargspec(fn).args if p != "cls"]
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
        filtered = {k: (None if isinstance(v, list) else v)  # a link: present, its value not known yet
                    for k, v in values.items() if k in named and k in expanded}
        if "unique_id" in named and "unique_id" in types.get("hidden", {}):
            filtered["unique_id"] = unique_id
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
            if messages is not None:
                messages.append(verdict)
    return bad


def queue_errors(prompt: dict, classes: dict) -> dict:
    """{node id: (inputs filed against, messages)} for an API prompt as ComfyUI's POST /prompt checks it: the
    on-prompt handlers first (SpecAR's, nodes/prompt_guard.py), on the prompt as posted, then each
    node's validation."""
    from specar.nodes import prompt_guard
    prompt_guard.register(classes, dynamic=any(is_dynamic(c) for c in classes.values()))  # as nodes/__init__.py
    prompt_guard.check_prompt({"prompt": prompt})
    out = {}
    for nid, node in prompt.items():
        cls = classes.get(node["class_type"])
        if cls is None:
            continue
        messages = []
        bad = comfy_validation_errors(cls, dict(node["inputs"]), unique_id=nid, messages=messages)
        if bad:
            out[nid] = (bad, messages)
    return out


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
        return True  # ComfyUI converts: bool(value), so "no" passes as on
    if kind == "STRING":
        return isinstance(value, str)
    return False


# ---------------------------------------------------------------------------------------------
# example workflows

def ui_files():
    files = sorted(glob.glob(os.path.join(EXAMPLES, "*.json")))
    assert files, "no example workflows"
    return files


def load_json(path):
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


def run_api_workflow(prompt, classes):
    """Validate and execute an API-format prompt node by node, as ComfyUI's executor does (converted
    to the flat layout first when the classes have no DynamicCombo)."""
    from support import workflows
    if not is_dynamic(classes["SpecARSampler"]):
        prompt = workflows.to_flat(prompt)
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


# ---------------------------------------------------------------------------------------------
# the sampler node

def sampler_values(**changes):
    from support import workflows
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
    return {"cfg_scale": "guidance.cfg_scale", "top_k": "guidance.top_k", "temperature": "sampling.temperature",
            "top_p": "sampling.top_p"}.get(flat_name, flat_name)


def run_sampler_node(cls, model, flat: dict):
    """Execute the sampler class with these values as ComfyUI would pass them (layout of the class)."""
    return execute(cls, model=model, **as_comfy_passes(cls, api_inputs(cls, flat)))


BASE = sampler_values()
BACKEND_CHOICES = ", ".join(SCHEMAS)


def stop_process(proc):
    """Stop a server started by a test: terminate, then kill if it has not exited in 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def api_twin(name: str, object_info: dict) -> str:
    """The API-format example for this server's sampler layout: DynamicCombo ("backend.window") or flat."""
    flat = "sjd_pac_window" in object_info["SpecARSampler"]["input"]["required"]
    return os.path.join(EXAMPLES, "api", *(["flat"] if flat else []), name)


def web_extension_folder(tmp_path):
    """The extension laid out as ComfyUI serves it (extensions/<pack>/specar.js next to scripts/app.js)."""
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(
        "globalThis.api = { addEventListener() {} };\n"
        "export const app = { api: globalThis.api, registerExtension(e) { globalThis.registered = e; } };\n")
    ext_dir = tmp_path / "extensions" / "specar"
    ext_dir.mkdir(parents=True)
    for name in os.listdir(os.path.join(ROOT, "web")):  # ComfyUI serves the whole web folder
        shutil.copy(os.path.join(ROOT, "web", name), ext_dir / name)
