"""The nodes as V3 classes (ComfyUI's `comfy_api.latest` schema), generated from spec.py like v1.py's:
`build_nodes(io)` takes the `comfy_api.latest.io` module as an argument, so importing this file needs no ComfyUI."""
from __future__ import annotations

from . import core, models, prompt_guard, spec
from .layouts import flat_prompt_on_dynamic
from .widgets import NodeSpec, Switch, Widget


def _widget_input(io, types: dict, w: Widget):
    inp = _make_input(io, types, w)
    if w.extra:  # keys for the web extension; extra_dict is not a constructor argument everywhere (0.3.x Combo)
        inp.extra_dict = {**(getattr(inp, "extra_dict", None) or {}), **w.extras()}
    return inp


def _make_input(io, types: dict, w: Widget):
    common = dict(tooltip=w.tooltip, optional=True) if w.optional else dict(tooltip=w.tooltip)
    if w.kind == "INT":
        return io.Int.Input(w.name, default=w.default, min=w.min, max=w.max, step=w.step,
                            control_after_generate=w.control_after_generate or None, **common)
    if w.kind == "FLOAT":
        return io.Float.Input(w.name, default=w.default, min=w.min, max=w.max, step=w.step, **common)
    if w.kind == "BOOLEAN":
        return io.Boolean.Input(w.name, default=w.default, **common)
    if w.kind == "STRING":
        return io.String.Input(w.name, default=w.default, multiline=w.multiline, **common)
    if w.kind == "COMBO":
        return io.Combo.Input(w.name, options=w.choices(), default=w.default, **common)
    return types[w.kind].Input(w.name, **common)


def _switch_input(io, types: dict, sw: Switch):
    """A Switch as one DynamicCombo (only the chosen option's inputs exist)."""
    options = [io.DynamicCombo.Option(key, [_widget_input(io, types, w) for w in widgets])
               for key, widgets in sw.options.items()]
    # the default option first: the frontend selects the first option of a new node
    options.sort(key=lambda o: o.key != sw.default)
    combo = io.DynamicCombo.Input(sw.name, options=options, tooltip=sw.tooltip)
    extra = sw.combo().extra
    if extra:
        combo.extra_dict = {**(getattr(combo, "extra_dict", None) or {}), **extra}
    return combo


def dynamic_combo_available(io) -> bool:
    """Whether this ComfyUI has the V3 DynamicCombo (0.3.76): else the pack registers its V1 nodes (nodes/__init__.py)."""
    return hasattr(io, "DynamicCombo") and hasattr(io.DynamicCombo, "Option")


def schema(io, types: dict, node: NodeSpec, hidden: tuple = ()):
    input_ids = {w.name for w in node.inputs}
    outputs = []
    for o in node.outputs:
        out_id = o.name if o.name not in input_ids else f"{o.name}_out"  # ids are unique across inputs and outputs
        outputs.append(types[o.kind].Output(out_id, display_name=o.name, tooltip=o.tooltip))
    return io.Schema(
        node_id=node.node_id,
        display_name=node.display_name,
        category=spec.CATEGORY,
        description=node.description,
        inputs=[_switch_input(io, types, w) if isinstance(w, Switch) else _widget_input(io, types, w)
                for w in node.inputs],
        outputs=outputs,
        is_output_node=node.output_node,
        **({"hidden": list(hidden)} if hidden else {}),
    )


def _refusal(cls):
    """This node's refusal noted on the prompt as posted (prompt_guard.py), by its hidden unique id."""
    return prompt_guard.refusal(getattr(getattr(cls, "hidden", None), "unique_id", None))


def build_nodes(io) -> list:
    """The V3 node classes, for the given `comfy_api.latest.io` module, which has the DynamicCombo (a ComfyUI without
    it runs the V1 classes, whose inputs are the same, flat)."""
    types = {
        spec.MODEL_TYPE: io.Custom(spec.MODEL_TYPE),
        spec.TOKENS_TYPE: io.Custom(spec.TOKENS_TYPE),
        "IMAGE": io.Image,
        "STRING": io.String,
    }

    # ComfyUI files a validate_inputs verdict under every input the function takes: each takes one, `model`,
    # which every prompt of the node has; the other refusals come from the prompt as posted (prompt_guard.py).

    class SpecARModelLoader(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return schema(io, types, models.loader_spec(), hidden=(io.Hidden.unique_id,))

        @classmethod
        def validate_inputs(cls, model=None):
            # the model's choice here; the choices that depend on the model on the prompt as posted
            return models.loader_error(model) or _refusal(cls) or True

        @classmethod
        def execute(cls, **values):
            return io.NodeOutput(models.load_handle(**values))

    class SpecARSampler(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return schema(io, types, models.sampler_spec(), hidden=(io.Hidden.unique_id,))

        # ComfyUI (execution.validate_inputs) passes the inputs this function names, then nests them
        # (build_nested_inputs), which adds a dict for EVERY DynamicCombo whose value is one of its options,
        # named or not: the switches are keyword-only, so that ComfyUI files the verdict under `model`
        # alone (a link, which every prompt has; a switch whose value is none of its options is dropped).
        @classmethod
        def validate_inputs(cls, model=None, *, backend=None, guidance=None, sampling=None):
            return _refusal(cls) or True

        @classmethod
        def execute(cls, model, **values):
            # an api/flat prompt on this DynamicCombo ComfyUI: only the samplers without parameters (AR) get
            # here, the others failed validation; say so instead of running the rest silently
            err = flat_prompt_on_dynamic(getattr(getattr(cls, "hidden", None), "prompt", None))
            if err:
                raise ValueError(err)
            outputs, ui = core.run_sampler_in_comfy(model, values)
            return io.NodeOutput(*outputs, ui=ui)

    class SpecARDecode(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return schema(io, types, spec.decode_spec())

        @classmethod
        def execute(cls, tokens):
            return io.NodeOutput(core.decode_tokens(tokens))

    return [SpecARModelLoader, SpecARSampler, SpecARDecode]
