"""The node pack's import and its schemas: V1 (INPUT_TYPES) and V3 (`io.*`, with and without DynamicCombo)
agree, every input is valid as ComfyUI reads it, the sampler's widgets follow the backend schemas.
The nodes run without ComfyUI: stand-ins from tests/support/comfy_stubs.py through the `comfy` fixture (tests/conftest.py).
"""
import dataclasses
import importlib.util
import inspect
import os
import subprocess
import sys

import pytest

import specar
from specar.nodes import layouts, models, spec, v1
from specar.samplers.target import SamplingParams
from specar.samplers import backends
from specar.samplers.backends import SCHEMAS
from specar.samplers.drafters.base import Drafter
from specar.samplers.drafters.params import param
from support.node_harness import (
    ROOT, param_names, flavours, node_classes, is_dynamic, stubs, validate_fn, widget_values_ok)


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
    assert [c.GET_SCHEMA().node_id for c in module.NODES] == ["SpecARModelLoader", "SpecARSampler", "SpecARDecode"]
    assert "specar" in sys.modules["folder_paths"].folder_names_and_paths  # models/specar registered


def test_pack_picks_v1_on_a_comfy_api_without_dynamic_combo(comfy, monkeypatch):
    """ComfyUI 0.3.64 (the floor) has comfy_api.latest but no DynamicCombo: the V1 classes, flat inputs."""
    monkeypatch.setattr(sys.modules["comfy_api.latest"], "io", stubs.make_io(with_dynamic_combo=False))
    init = os.path.join(ROOT, "nodes", "__init__.py")
    mspec = importlib.util.spec_from_file_location("specar.nodes", init,
                                                   submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    assert module.NODE_API == "v1" and module.NODE_CLASS_MAPPINGS == v1.NODE_CLASS_MAPPINGS


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
        assert set(inputs) <= {"required", "optional", "hidden"}  # hidden: an output node's prompt, extra_pnginfo, id
        # optional: only the inputs added after 0.1 (API prompts saved before them stay valid)
        added = {"SpecARModelLoader": ["resolution", "offload", "quantize"],
                 "SpecARSampler": ["compare_with_ar", "compile", "same_image_as_ar", "reference_images"]}
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
    # ComfyUI checks the other inputs itself (each bad value filed once, on its input), and files a validate
    # function's verdict under every input the function takes (its positional arguments): each takes one, V3 the
    # `model` every prompt has (the sampler's switches keyword-only: ComfyUI passes every DynamicCombo), V1 the
    # hidden id; the refusals that need more inputs are noted on the prompt as posted (nodes/prompt_guard.py)
    one = ["unique_id"] if flavour == "v1" else ["model"]
    named = {"SpecARModelLoader": one, "SpecARDecode": None, "SpecARSampler": one}
    for name, cls in classes.items():
        fn = validate_fn(cls)
        assert (fn and [p for p in inspect.getfullargspec(fn).args if p != "cls"]) == named[name], name
    assert sampler.OUTPUT_NODE and sampler.RETURN_NAMES == ("image", "tokens", "stats", "acceptance_heatmap")
    assert sampler.RETURN_TYPES == ("IMAGE", "SPECAR_TOKENS", "STRING", "IMAGE")
    assert classes["SpecARModelLoader"].RETURN_TYPES == ("SPECAR_MODEL",)
    assert classes["SpecARModelLoader"].RETURN_NAMES == ("model",)


def test_dynamic_combo_options_carry_the_flat_inputs(comfy):
    flat = v1.SpecARSampler.INPUT_TYPES()["required"]
    dynamic = node_classes("v3")["SpecARSampler"].INPUT_TYPES()["required"]
    assert [k for k in dynamic if k not in ("model",)] == ["prompt", "negative_prompt", "seed", "backend", "guidance",
                                                          "sampling", "batch_size", "preview"]
    for switch, prefix in (("backend", True), ("guidance", False), ("sampling", False)):
        for option in dynamic[switch][1]["options"]:
            for sub, (kind, opts) in option["inputs"].get("required", {}).items():
                fkind, fopts = flat[f"{option['key']}_{sub}" if prefix else sub]
                assert (kind == fkind) or (kind == "COMBO" and opts["options"] == fkind), (switch, sub)
                for key in ("default", "min", "max", "tooltip"):
                    assert opts.get(key) == fopts.get(key), (switch, option["key"], sub, key)


def test_v1_and_v3_schemas_agree(comfy):
    """Every input but the switches' (test_dynamic_combo_options_carry_the_flat_inputs) alike in both flavours."""
    from specar.nodes.widgets import Switch
    switched = {w.name for sw in spec.sampler_spec().inputs if isinstance(sw, Switch) for w in sw.flat_widgets()}
    a, b = node_classes("v1"), node_classes("v3")
    for name in a:
        ta, tb = a[name].INPUT_TYPES(), b[name].INPUT_TYPES()
        ta.pop("hidden", None), tb.pop("hidden", None)  # V3 adds an output node's hidden inputs itself
        ta, tb = ({part: {k: v for k, v in inputs.items() if k not in switched} for part, inputs in t.items()}
                  for t in (ta, tb))
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
    @dataclasses.dataclass(frozen=True)
    class FakeParams:
        window: int = param(8, "drafts per forward", lo=1, hi=32, paper="Fake paper: 8")
        lossy: bool = param(False, "relaxed acceptance (lossy)")
        delta: float = param(0.1, "relaxation cap", lo=0.0, hi=1.0)
        variant: str = param("tree", "how candidates are arranged", choices=("tree", "chain"))
    fake = backends.Method("fake", "Fake-Spec", "a backend added later", FakeParams, Drafter)
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
    flat = {"backend": "fake", "fake_window": 4, "fake_lossy": True, "sjd_window": 9, "guidance": "model default",
            "sampling": "model default"}
    nested = {"backend": {"backend": "fake", "window": 4, "lossy": True}, "guidance": {"guidance": "model default"},
              "sampling": {"sampling": "model default"}}
    for values in (flat, nested):
        got = layouts.sampler_settings(values)
        assert (got.backend, got.params, got.sampling) == ("fake", {"window": 4, "lossy": True}, SamplingParams(None, None, None, None))
    custom = layouts.sampler_settings({"backend": "sjd", "guidance": "custom", "cfg_scale": 0.0, "top_k": 0,
                                       "sampling": "model default"})
    assert (custom.sampling.cfg_scale, custom.sampling.top_k) == (0.0, 0)  # custom top_k 0 = all tokens (no top-k), not None (the model's)
    # SpecAR 0.1 API prompts: shared names, window 0 / cfg_scale -1 / top_k 0 = the default
    legacy = layouts.sampler_settings({"backend": "sjd_pac", "window": 0, "tree_depth": 2, "init": "random",
                                    "cfg_scale": -1.0, "top_k": 0})
    assert (legacy.params, legacy.sampling.cfg_scale, legacy.sampling.top_k) == ({"tree_depth": 2, "init": "random"}, None, None)
    legacy = layouts.sampler_settings({"backend": "sjd", "window": 8, "tree_depth": 2, "cfg_scale": 2.0, "top_k": 7})
    assert (legacy.params, legacy.sampling.cfg_scale, legacy.sampling.top_k) == ({"window": 8}, 2.0, 7)
    with pytest.raises(ValueError, match="backend must be one of ar, .*fake; got 'turbo'"):
        layouts.sampler_settings({"backend": "turbo"})
