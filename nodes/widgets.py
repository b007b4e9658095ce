"""The nodes' declaration language, ComfyUI-free: `Widget` (one input), `Switch` (a choice that decides which further
inputs apply), `Output`, `NodeSpec` (docs/NODES.md, "How the pack is built"). A Switch is ComfyUI's V3 DynamicCombo
where the running ComfyUI has it, else a combo followed by every option's inputs, flattened (`Switch.flat_name`),
which the web extension hides unless their option is chosen."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from ..samplers.drafters.params import Param

NOT_AN_OPTION = "none (a value that is not an option)"  # what ComfyUI leaves of a DynamicCombo value it drops


@dataclass
class Widget:
    """One node input. kind: INT, FLOAT, BOOLEAN, STRING, COMBO, or a socket type (IMAGE, SPECAR_MODEL...)."""
    name: str
    kind: str
    tooltip: str
    default: Any = None
    min: Optional[Union[int, float]] = None
    max: Optional[Union[int, float]] = None
    step: Optional[Union[int, float]] = None
    options: Union[tuple, Callable[[], list], None] = None  # COMBO choices (a callable is re-read each time)
    multiline: bool = False
    control_after_generate: bool = False
    optional: bool = False  # ComfyUI may leave it out (API prompts saved before it existed): `default` is used
    extra: dict = field(default_factory=dict)  # more input options for the web extension (a callable: read each time)
    source: Any = None  # the library's value this input shows (a backend Param, a SamplingField): its check is this one

    @property
    def is_widget(self) -> bool:
        return self.kind in ("INT", "FLOAT", "BOOLEAN", "STRING", "COMBO")

    def extras(self) -> dict:
        return {k: v() if callable(v) else v for k, v in self.extra.items()}

    def choices(self) -> list:
        opts = self.options() if callable(self.options) else self.options
        return list(opts or ())

    def param(self) -> Param:
        """What this input's value is checked as: the library's value it shows (`source`, under this input's name),
        else a `Param` made from the declaration (range, choices, kind)."""
        if self.source is not None:
            return replace(self.source, name=self.name)
        default = {"INT": 0, "FLOAT": 0.0, "BOOLEAN": False}.get(self.kind, "")  # the kind Param checks by
        choices = tuple(map(str, self.choices())) or ("(none available)",) if self.kind == "COMBO" else ()
        return Param(self.name, default, self.tooltip, lo=self.min, hi=self.max, choices=choices)

    def check(self, value) -> Optional[str]:
        """None if `value` is valid for this widget, else the error message (`Param.check`'s)."""
        return input_error(self.param(), value)


def input_error(param: Param, value) -> Optional[str]:
    """None if `value` passes `param.check` (samplers/drafters/params.py, the one check of a value), else its
    message as a ComfyUI user reads it: true / false as a prompt spells them, a value ComfyUI dropped (None) so named."""
    try:
        param.check(value)
    except ValueError as e:
        text = comfy_message(str(e))
        return text.replace("got None", f"got {NOT_AN_OPTION}") if value is None else text
    return None


@dataclass
class Output:
    name: str
    kind: str
    tooltip: str


@dataclass
class NodeSpec:
    node_id: str
    display_name: str
    description: str
    inputs: list
    outputs: list
    output_node: bool = False


def validate(inputs: list, values: dict) -> Optional[str]:
    """The first error among the widget values present in `values` (absent or None = linked: skipped);
    a Switch's inputs are checked for its chosen option only, flat or nested (V3 DynamicCombo)."""
    for w in inputs:
        err = None
        if isinstance(w, Switch):
            err = w.check(values)
        elif w.is_widget and values.get(w.name) is not None:
            err = w.check(values[w.name])
        if err:
            return err
    return None


def comfy_message(text: str) -> str:
    """A library message as a ComfyUI user reads it: true / false spelled as in a prompt."""
    return text.replace("True or False", "true or false")


def choice_error(name: str, options, key) -> Optional[str]:
    """None if `key` is one of `options`; None stands for a value ComfyUI dropped as none of them."""
    return input_error(Param(name, "", "", choices=tuple(options)), key)


@dataclass
class Switch:
    """A choice that decides which further inputs apply: the backend (its own parameters), guidance, sampling."""
    name: str
    tooltip: str
    default: str
    options: dict  # option key -> [Widget] (its inputs, named without prefix)
    prefix: bool = False  # flattened names: "<option>_<input>" (options share input names) or the input's own
    labels: dict = field(default_factory=dict)  # option key -> readable name (the web extension's node title)

    def flat_name(self, key: str, w: Widget) -> str:
        return f"{key}_{w.name}" if self.prefix else w.name

    def combo(self) -> Widget:
        extra = {"specar_labels": dict(self.labels)} if self.labels else {}
        return Widget(self.name, "COMBO", self.tooltip, default=self.default, options=tuple(self.options), extra=extra)

    def choice_error(self, key) -> Optional[str]:
        return choice_error(self.name, self.options, key)

    def check(self, values: dict) -> Optional[str]:
        """None if the choice and its option's inputs in `values` are valid (flat or nested layout)."""
        value = values.get(self.name)
        if value is None:
            return None
        nested = isinstance(value, dict)
        key = value.get(self.name) if nested else value
        err = self.choice_error(key)
        if err:
            return err
        for w in self.options[key]:
            v = value.get(w.name) if nested else values.get(self.flat_name(key, w))
            err = None if v is None else w.check(v)
            if err:
                return err.replace(w.name, self.flat_name(key, w), 1) if not nested else err
        return None

    def flat_widgets(self) -> list:
        out = [self.combo()]
        for key, widgets in self.options.items():
            out += [replace(w, name=self.flat_name(key, w)) for w in widgets]
        return out


def flatten(inputs: list) -> list:
    """Inputs with every Switch flattened (the V1 layout, and the V3 one without DynamicCombo)."""
    out = []
    for w in inputs:
        out += w.flat_widgets() if isinstance(w, Switch) else [w]
    return out

