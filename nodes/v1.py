"""The nodes as V1 classes (INPUT_TYPES dictionaries), generated from spec.py like v3.py's: for a ComfyUI without
the V3 DynamicCombo (nodes/__init__.py); the work is done by core.py and models.py."""
from __future__ import annotations

from . import core, models, prompt_guard, spec
from .widgets import NodeSpec, Widget, flatten


def input_options(w: Widget) -> tuple:
    """One V1 input entry: (TYPE or [choices], {options})."""
    opts = {"tooltip": w.tooltip}
    if w.default is not None:
        opts["default"] = w.default
    for key in ("min", "max", "step"):
        if getattr(w, key) is not None:
            opts[key] = getattr(w, key)
    if w.kind == "STRING":
        opts["multiline"] = w.multiline
    if w.control_after_generate:
        opts["control_after_generate"] = True
    opts.update(w.extras())
    kind = w.choices() if w.kind == "COMBO" else w.kind
    return (kind, opts)


def input_types(node: NodeSpec) -> dict:
    types = {"required": {}, "optional": {}}
    for w in flatten(node.inputs):
        types["optional" if w.optional else "required"][w.name] = input_options(w)
    return {k: v for k, v in types.items() if v or k == "required"}


def _make(node_fn, function: str, run, validate):
    node = node_fn()

    class Node:
        @classmethod
        def INPUT_TYPES(cls):
            types = input_types(node_fn())
            if validate is not None:
                types["hidden"] = {"unique_id": "UNIQUE_ID"}
            return types

        # ComfyUI files a VALIDATE_INPUTS verdict under every input the function takes: it takes only the
        # hidden unique_id, by which it finds this node's refusal noted on the prompt as posted (prompt_guard.py)
        if validate is not None:
            VALIDATE_INPUTS = classmethod(validate)

    Node.__name__ = node.node_id
    Node.__qualname__ = node.node_id
    Node.DESCRIPTION = node.description
    Node.CATEGORY = spec.CATEGORY
    Node.RETURN_TYPES = tuple(o.kind for o in node.outputs)
    Node.RETURN_NAMES = tuple(o.name for o in node.outputs)
    Node.OUTPUT_TOOLTIPS = tuple(o.tooltip for o in node.outputs)
    Node.OUTPUT_NODE = node.output_node
    Node.FUNCTION = function
    setattr(Node, function, run)
    return Node


def _validate(cls, unique_id=None):
    return prompt_guard.refusal(unique_id) or True


def _load(self, unique_id=None, **values):  # unique_id: the hidden input ComfyUI passes along
    return (models.load_handle(**values),)


def _sample(self, model, unique_id=None, **values):  # unique_id: the hidden input ComfyUI passes along
    outputs, ui = core.run_sampler_in_comfy(model, values)
    return {"ui": ui, "result": outputs}


def _decode(self, tokens):
    return (core.decode_tokens(tokens),)


NODE_SPECS = ((models.loader_spec, "load", _load, _validate), (models.sampler_spec, "sample", _sample, _validate),
              (spec.decode_spec, "decode", _decode, None))
NODES = [_make(*n) for n in NODE_SPECS]
SpecARModelLoader, SpecARSampler, SpecARDecode = NODES
NODE_CLASS_MAPPINGS = {cls.__name__: cls for cls in NODES}
NODE_DISPLAY_NAME_MAPPINGS = {node().node_id: node().display_name for node, *_ in NODE_SPECS}
