"""Stand-ins for the ComfyUI modules the SpecAR nodes touch, for tests without ComfyUI.

`stub_modules(state, models_dir)` returns {module name: module} for `comfy`, `comfy.utils`,
`comfy.model_management`, `folder_paths`, `comfy_api`, `comfy_api.latest`, `server`; the test puts them in
sys.modules with monkeypatch (restored after each test). The `comfy_api.latest.io` stand-in
follows the real module's constructor signatures and its schema rules (unique ids across inputs
and outputs, V1 view of a V3 schema, output names from display names), as read from ComfyUI's
comfy_api/latest/_io.py, so that a wrong keyword or a clashing id fails here as it would there.
"""
from __future__ import annotations

import dataclasses
import os
import types
from collections import Counter
from typing import Any


class InterruptProcessingException(Exception):
    pass


def _prune(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


class _classproperty:
    def __init__(self, f):
        self.f = f

    def __get__(self, obj, owner):
        return self.f(owner)


def make_io(with_dynamic_combo: bool = True):
    io = types.ModuleType("comfy_api.latest.io")

    class Input:
        def __init__(self, id: str, display_name: str = None, optional=False, tooltip: str = None, lazy: bool = None,
                     extra_dict=None, raw_link: bool = None):
            self.id, self.display_name, self.optional, self.tooltip, self.lazy = id, display_name, optional, tooltip, lazy
            self.extra_dict = extra_dict or {}

        def as_dict(self):
            return _prune({"display_name": self.display_name, "optional": self.optional, "tooltip": self.tooltip,
                           "lazy": self.lazy}) | _prune(self.extra_dict)

        def get_io_type(self):
            return self.Parent.io_type

        def validate(self):
            pass

    class WidgetInput(Input):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default=None,
                     socketless=None, widget_type=None, force_input=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict, raw_link)
            self.default = default

        def as_dict(self):
            return super().as_dict() | _prune({"default": self.default})

    class Output:
        def __init__(self, id: str = None, display_name: str = None, tooltip: str = None, is_output_list=False):
            self.id, self.display_name, self.tooltip, self.is_output_list = id, display_name, tooltip, is_output_list

        @property
        def io_type(self):
            return self.Parent.io_type

        def validate(self):
            pass

    def comfytype(io_type, input_cls=Input, output_cls=Output):
        class T:
            pass
        T.io_type = io_type
        T.Input = type("Input", (input_cls,), {"Parent": T})
        T.Output = type("Output", (output_cls,), {"Parent": T})
        return T

    class IntInput(WidgetInput):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default: int = None,
                     min: int = None, max: int = None, step: int = None, control_after_generate: bool = None,
                     display_mode=None, socketless=None, force_input=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input,
                             extra_dict, raw_link)
            self.min, self.max, self.step, self.control_after_generate = min, max, step, control_after_generate

        def as_dict(self):
            return super().as_dict() | _prune({"min": self.min, "max": self.max, "step": self.step,
                                               "control_after_generate": self.control_after_generate})

    class FloatInput(WidgetInput):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default: float = None,
                     min: float = None, max: float = None, step: float = None, round: float = None,
                     display_mode=None, socketless=None, force_input=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input,
                             extra_dict, raw_link)
            self.min, self.max, self.step, self.round = min, max, step, round

        def as_dict(self):
            return super().as_dict() | _prune({"min": self.min, "max": self.max, "step": self.step, "round": self.round})

    class StringInput(WidgetInput):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, multiline=False,
                     placeholder: str = None, default: str = None, dynamic_prompts: bool = None, socketless=None,
                     force_input=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input,
                             extra_dict, raw_link)
            self.multiline = multiline

        def as_dict(self):
            return super().as_dict() | _prune({"multiline": self.multiline})

    class BooleanInput(WidgetInput):
        def __init__(self, id, display_name=None, optional=False, tooltip=None, lazy=None, default: bool = None,
                     label_on: str = None, label_off: str = None, socketless=None, force_input=None, extra_dict=None,
                     raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, force_input,
                             extra_dict, raw_link)

    class ComboInput(WidgetInput):
        def __init__(self, id, options=None, display_name=None, optional=False, tooltip=None, lazy=None,
                     default=None, control_after_generate: bool = None, upload=None, image_folder=None, remote=None,
                     socketless=None, extra_dict=None, raw_link=None):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, None, None, extra_dict,
                             raw_link)
            self.options = options
            self.control_after_generate = control_after_generate

        def as_dict(self):
            return super().as_dict() | _prune({"multiselect": False, "options": self.options,
                                               "control_after_generate": self.control_after_generate})

    io.Input, io.WidgetInput, io.Output = Input, WidgetInput, Output
    io.Int = comfytype("INT", IntInput)
    io.Float = comfytype("FLOAT", FloatInput)
    io.String = comfytype("STRING", StringInput)
    io.Boolean = comfytype("BOOLEAN", BooleanInput)
    io.Combo = comfytype("COMBO", ComboInput)
    io.Image = comfytype("IMAGE")
    io.Custom = lambda io_type: comfytype(io_type)

    def input_dict_v1(inputs) -> dict:  # _io.create_input_dict_v1: "required" always there, maybe empty
        out = {"required": {}}
        for i in inputs:
            d = i.as_dict()
            d.pop("optional", None)
            out.setdefault("optional" if i.optional else "required", {})[i.id] = (i.get_io_type(), d)
        return out

    class DynamicComboOption:
        def __init__(self, key: str, inputs: list):
            self.key, self.inputs = key, inputs

        def as_dict(self):
            return {"key": self.key, "inputs": input_dict_v1(self.inputs)}

    class DynamicComboInput(Input):
        def __init__(self, id, options: list, display_name=None, optional=False, tooltip=None, lazy=None,
                     extra_dict=None):
            super().__init__(id, display_name, optional, tooltip, lazy, extra_dict)
            self.options = options

        def as_dict(self):
            return super().as_dict() | {"options": [o.as_dict() for o in self.options]}

    if with_dynamic_combo:  # ComfyUI >= 0.3.76 (comfy_api/latest/_io.py DynamicCombo)
        io.DynamicCombo = comfytype("COMFY_DYNAMICCOMBO_V3", DynamicComboInput)
        io.DynamicCombo.Option = DynamicComboOption

    class Hidden:
        unique_id = "UNIQUE_ID"
        prompt = "PROMPT"
        extra_pnginfo = "EXTRA_PNGINFO"

    @dataclasses.dataclass
    class Schema:
        node_id: str
        display_name: str = None
        category: str = "sd"
        inputs: list = dataclasses.field(default_factory=list)
        outputs: list = dataclasses.field(default_factory=list)
        hidden: list = dataclasses.field(default_factory=list)
        description: str = ""
        is_input_list: bool = False
        is_output_node: bool = False
        is_deprecated: bool = False
        is_experimental: bool = False
        is_api_node: bool = False
        not_idempotent: bool = False
        enable_expand: bool = False

        def validate(self):
            input_ids = [i.id for i in self.inputs]
            output_ids = [o.id for o in self.outputs]
            issues = []
            if len(set(input_ids)) != len(input_ids):
                issues.append(f"Input ids must be unique, but {[i for i, c in Counter(input_ids).items() if c > 1]} are not.")
            if len(set(output_ids)) != len(output_ids):
                issues.append(f"Output ids must be unique, but {[i for i, c in Counter(output_ids).items() if c > 1]} are not.")
            if set(input_ids) & set(output_ids):
                issues.append(f"Ids must be unique between inputs and outputs, but {set(input_ids) & set(output_ids)} are not.")
            if issues:
                raise ValueError("\n".join(issues))

        def finalize(self):
            if self.is_output_node:
                self.hidden = list(self.hidden) + [Hidden.prompt, Hidden.extra_pnginfo]
            for i, o in enumerate(self.outputs):
                if o.id is None:
                    o.id = f"_{i}_{o.io_type}_"

    class NodeOutput:
        def __init__(self, *args: Any, ui=None, expand: dict = None, block_execution: str = None):
            self.args, self.ui = args, ui

        @property
        def result(self):
            return self.args if self.args else None

    class ComfyNode:
        @classmethod
        def GET_SCHEMA(cls):
            schema = cls.define_schema()
            schema.finalize()
            schema.validate()
            return schema

        @classmethod
        def INPUT_TYPES(cls):  # Schema.get_v1_info: the inputs, then the hidden ones (an output node's)
            schema = cls.GET_SCHEMA()
            out = input_dict_v1(schema.inputs)
            for h in schema.hidden:  # the real Hidden is an enum: name "prompt", value "PROMPT"
                out.setdefault("hidden", {})[h.lower()] = (h,)
            return out

        RETURN_TYPES = _classproperty(lambda cls: tuple(o.io_type for o in cls.GET_SCHEMA().outputs))
        RETURN_NAMES = _classproperty(lambda cls: tuple(o.display_name or o.io_type for o in cls.GET_SCHEMA().outputs))
        OUTPUT_TOOLTIPS = _classproperty(lambda cls: tuple(o.tooltip for o in cls.GET_SCHEMA().outputs))
        CATEGORY = _classproperty(lambda cls: cls.GET_SCHEMA().category)
        DESCRIPTION = _classproperty(lambda cls: cls.GET_SCHEMA().description)
        OUTPUT_NODE = _classproperty(lambda cls: cls.GET_SCHEMA().is_output_node)
        FUNCTION = "EXECUTE_NORMALIZED"

        @classmethod
        def validate_inputs(cls, **kwargs):
            raise NotImplementedError

        @classmethod
        def EXECUTE_NORMALIZED(cls, *args, **kwargs):
            out = cls.execute(*args, **kwargs)
            if isinstance(out, tuple):
                out = NodeOutput(*out)
            assert isinstance(out, NodeOutput), f"{cls.__name__}.execute returned {type(out).__name__}"
            return out

    io.Hidden, io.Schema, io.NodeOutput, io.ComfyNode = Hidden, Schema, NodeOutput, ComfyNode
    return io


def stub_modules(state: dict, models_dir: str) -> dict:
    """state: {"interrupt": bool, "progress": [(value, total)], "unloaded": int} shared with the test."""
    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    mm = types.ModuleType("comfy.model_management")

    def throw_exception_if_processing_interrupted():
        if state["interrupt"]:
            state["interrupt"] = False
            raise InterruptProcessingException()

    class ProgressBar:  # like ComfyUI's: every update runs the interrupt check (through the progress hook)
        def __init__(self, total, node_id=None):
            self.total, self.current = total, 0

        def update_absolute(self, value, total=None, preview=None):
            if total is not None:
                self.total = total
            self.current = min(value, self.total)
            state["progress"].append((self.current, self.total))
            if preview is not None:  # ("JPEG" | "PNG", PIL image, max size), as ComfyUI's previewer takes it
                state.setdefault("previews", []).append(preview)
            if state.get("interrupt_in_progress_hook", True):
                throw_exception_if_processing_interrupted()

        def update(self, value):
            self.update_absolute(self.current + value)

    def unload_all_models():
        state["unloaded"] = state.get("unloaded", 0) + 1

    def free_memory(memory_required, device, keep_loaded=()):
        state.setdefault("free_memory_calls", []).append((memory_required, str(device)))

    utils.ProgressBar = ProgressBar
    mm.free_memory = free_memory
    mm.get_free_memory = lambda device=None, torch_free_too=False: state.get("free_bytes", 1 << 40)
    mm.InterruptProcessingException = InterruptProcessingException
    mm.processing_interrupted = lambda: state["interrupt"]
    mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
    mm.get_torch_device = lambda: "cpu"
    mm.unload_all_models = unload_all_models
    comfy.utils, comfy.model_management = utils, mm

    folder_paths = types.ModuleType("folder_paths")
    folder_paths.models_dir = models_dir
    folder_paths.folder_names_and_paths = {}

    def add_model_folder_path(name, path, is_default=False):
        paths, exts = folder_paths.folder_names_and_paths.setdefault(name, ([], set()))
        if path not in paths:
            paths.insert(0, path) if is_default else paths.append(path)

    def get_folder_paths(name):
        return list(folder_paths.folder_names_and_paths[name][0])  # KeyError when unregistered, as in ComfyUI

    folder_paths.add_model_folder_path = add_model_folder_path
    folder_paths.get_folder_paths = get_folder_paths

    comfy_api = types.ModuleType("comfy_api")
    latest = types.ModuleType("comfy_api.latest")
    latest.io = make_io()
    latest.ui = types.ModuleType("comfy_api.latest.ui")

    class ComfyExtension:
        async def on_load(self):
            pass

    latest.ComfyExtension = ComfyExtension
    comfy_api.latest = latest

    server = types.ModuleType("server")

    class PromptServer:  # what the nodes use of ComfyUI's server: events to the browser, on-prompt handlers
        instance = None

        def __init__(self):
            self.client_id, self.last_node_id, self.on_prompt_handlers = "client", None, []

        def send_sync(self, event, data, sid=None):
            state.setdefault("events", []).append((event, data))

        def send_progress_text(self, text, node_id, sid=None):
            state.setdefault("progress_text", []).append((text, node_id))

        def add_on_prompt_handler(self, handler):
            self.on_prompt_handlers.append(handler)

    PromptServer.instance = PromptServer()
    server.PromptServer = PromptServer
    state["server"] = PromptServer.instance
    return {"comfy": comfy, "comfy.utils": utils, "comfy.model_management": mm, "folder_paths": folder_paths,
            "comfy_api": comfy_api, "comfy_api.latest": latest, "server": server}


def make_model_folder(models_dir: str, name: str, model_type: str = "janus") -> str:
    path = os.path.join(models_dir, "specar", name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write('{"model_type": "%s"}' % model_type)
    return path
