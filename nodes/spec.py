"""The nodes' inputs and outputs, declared once, ComfyUI-free.

Both node flavours are generated from these declarations: the V3 classes (`v3.py`, ComfyUI's
`comfy_api.latest` schema) and the V1 classes (`v1.py`, `INPUT_TYPES` dictionaries), so the two
cannot drift apart. The backend widgets are built from `specar.BACKEND_PARAMS`: a backend added
there appears on the sampler node with no change here (optional `PARAM_CHOICES` / `PARAM_RANGES`
dictionaries in samplers/backends.py give its string parameters a dropdown and its numbers limits).

`validate(widgets, values)` is the nodes' own validation: ComfyUI does not check every widget
value itself (combo values of V3 schemas, values of API-format prompts sent over HTTP), and a
custom validation function makes it skip its own range checks, so ours checks everything.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..samplers import backends as _backends
from ..samplers.backends import BACKEND_PARAMS, COUPLINGS, INITS, MAX_WINDOW

CATEGORY = "SpecAR"
SEED_MAX = 0xFFFFFFFFFFFFFFFF
INT_MAX = 2**31 - 1
MODEL_TYPE = "SPECAR_MODEL"
TOKENS_TYPE = "SPECAR_TOKENS"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
CONTROL_AFTER_GENERATE = ("fixed", "increment", "decrement", "randomize")


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

    @property
    def is_widget(self) -> bool:
        return self.kind in ("INT", "FLOAT", "BOOLEAN", "STRING", "COMBO")

    def choices(self) -> list:
        opts = self.options() if callable(self.options) else self.options
        return list(opts or ())

    def check(self, value) -> Optional[str]:
        """None if `value` is valid for this widget, else the error message."""
        n = self.name
        if self.kind == "COMBO":
            allowed = self.choices()
            if value not in allowed:
                return f"{n} must be one of {', '.join(map(str, allowed)) or '(none available)'}; got {value!r}"
        elif self.kind == "INT":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{n} must be an integer, got {value!r}"
        elif self.kind == "FLOAT":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"{n} must be a finite number, got {value!r}"
        elif self.kind == "BOOLEAN":
            if not isinstance(value, bool):
                return f"{n} must be true or false, got {value!r}"
        elif self.kind == "STRING":
            if not isinstance(value, str):
                return f"{n} must be a string, got {type(value).__name__}"
        if self.kind in ("INT", "FLOAT"):
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                return f"{n} must be in [{self.min}, {self.max}], got {value!r}"
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
    extra: dict = field(default_factory=dict)

    def widgets(self) -> list:
        return [w for w in self.inputs if w.is_widget]


def validate(inputs: list, values: dict) -> Optional[str]:
    """The first error among the widget values present in `values` (absent or None = linked: skipped)."""
    for w in inputs:
        if w.is_widget and values.get(w.name) is not None:
            err = w.check(values[w.name])
            if err:
                return err
    return None


# ---------------------------------------------------------------------------------------------
# backend parameters -> widgets

# what the papers recommend, allowed values and ranges: all from the backends' parameter schemas
PAPER_NOTES = dict(_backends.PAPER_NOTES)
PARAM_CHOICES = {"init": INITS, "coupling": COUPLINGS, **_backends.PARAM_CHOICES}
PARAM_RANGES = {"window": (1, MAX_WINDOW), **_backends.PARAM_RANGES}


def _defaults_by_backend(param: str) -> dict:
    return {b: spec[param][0] for b, spec in BACKEND_PARAMS.items() if param in spec}


def backend_default_sentinel(param: str):
    """0 for an integer parameter whose default differs between backends and whose valid range
    starts at 1: the widget's 0 then means "the chosen backend's own default". None otherwise."""
    defaults = _defaults_by_backend(param)
    values = set(defaults.values())
    if len(values) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        lo = PARAM_RANGES.get(param, (1, None))[0]
        if lo is not None and lo >= 1:
            return 0
    return None


def backend_param_widgets() -> list:
    """One widget per backend parameter name (shared by the backends that have it)."""
    widgets = []
    names = []
    for spec in BACKEND_PARAMS.values():
        names += [p for p in spec if p not in names]
    for name in names:
        defaults = _defaults_by_backend(name)
        first_backend = next(iter(defaults))
        default, description = BACKEND_PARAMS[first_backend][name]
        users = ", ".join(defaults)
        sentinel = backend_default_sentinel(name)
        if sentinel is not None:
            per = ", ".join(f"{b} {v}" for b, v in defaults.items())
            default_text = f"{sentinel} = the chosen backend's own default ({per})"
        elif len(set(map(repr, defaults.values()))) > 1:
            default_text = "defaults: " + ", ".join(f"{b} {v}" for b, v in defaults.items())
        else:
            default_text = f"default {default}"
        tooltip = f"{description}. {default_text[0].upper()}{default_text[1:]}"
        if name in PAPER_NOTES:
            tooltip += f"; {PAPER_NOTES[name]}"
        tooltip += f". Used by: {users} (ignored by the other backends)."
        lo, hi = PARAM_RANGES.get(name, (None, None))
        if isinstance(default, bool):
            w = Widget(name, "BOOLEAN", tooltip, default=default)
        elif isinstance(default, int):
            if sentinel is not None:
                default, lo = sentinel, sentinel
            w = Widget(name, "INT", tooltip, default=default, min=0 if lo is None else lo,
                       max=INT_MAX if hi is None else hi, step=1)
        elif isinstance(default, float):
            w = Widget(name, "FLOAT", tooltip, default=default, min=0.0 if lo is None else lo,
                       max=1e6 if hi is None else hi, step=0.05)
        elif name in PARAM_CHOICES:
            w = Widget(name, "COMBO", tooltip, default=default, options=tuple(PARAM_CHOICES[name]))
        else:
            w = Widget(name, "STRING", tooltip, default=str(default))
        widgets.append(w)
    return widgets


def backend_values(backend: str, values: dict) -> dict:
    """The parameters the chosen backend takes, from the widget values (sentinels resolved)."""
    if backend not in BACKEND_PARAMS:
        raise ValueError(f"backend must be one of {', '.join(BACKEND_PARAMS)}; got {backend!r}")
    out = {}
    for name, (default, _) in BACKEND_PARAMS[backend].items():
        if name not in values or values[name] is None:
            continue
        value = values[name]
        sentinel = backend_default_sentinel(name)
        if sentinel is not None and value == sentinel:
            value = default
        out[name] = value
    return out


BACKEND_HELP = {name: schema.summary for name, schema in _backends.SCHEMAS.items()}


# ---------------------------------------------------------------------------------------------
# the nodes

def loader_spec(model_choices: Callable[[], list]) -> NodeSpec:
    return NodeSpec(
        node_id="SpecARModelLoader",
        display_name="SpecAR Model Loader",
        description=("Load an autoregressive image model: the embedded demo model, or a model folder (transformers "
                     "format, family recognised from its config.json) under ComfyUI/models/specar. The model stays "
                     "loaded across runs and is freed when ComfyUI unloads models."),
        inputs=[
            Widget("model", "COMBO", "demo: the small model shipped with SpecAR (runs on a CPU); other entries: "
                   "model folders under ComfyUI/models/specar (Janus-Pro, Emu3 in transformers format)",
                   default="demo", options=model_choices),
            Widget("device", "COMBO", "where the model runs; auto: ComfyUI's device", default="auto",
                   options=DEVICES),
            Widget("dtype", "COMBO", "weights precision; auto: the model's recommended one (float32 on CPU)",
                   default="auto", options=DTYPES),
        ],
        outputs=[Output("model", MODEL_TYPE, "the loaded model, cached across runs")],
    )


def sampler_spec() -> NodeSpec:
    backends = tuple(BACKEND_PARAMS)  # read each time: a backend registered later appears too
    backend_tip = "; ".join(f"{b}: {BACKEND_HELP.get(b, b)}" for b in backends)
    inputs = [
        Widget("model", MODEL_TYPE, "from the SpecAR Model Loader"),
        Widget("prompt", "STRING", "what to draw", default="a large red circle on a blue background",
               multiline=True),
        Widget("negative_prompt", "STRING", "the unconditional branch of classifier-free guidance "
               "(empty: the model's default)", default="", multiline=True),
        Widget("seed", "INT", "random seed: the same seed, sampling settings and backend give the same image; "
               "lossless backends sample the same distribution as AR", default=0, min=0, max=SEED_MAX,
               control_after_generate=True),
        Widget("backend", "COMBO", f"how tokens are drafted and verified. {backend_tip}. Default sjd_pac "
               "(every lossless backend samples exactly what AR samples)", default="sjd_pac" if "sjd_pac" in backends
               else backends[0], options=backends),
        Widget("cfg_scale", "FLOAT", "classifier-free guidance scale; -1 = the model's recommended value "
               "(demo 3, Emu3 3, Janus-Pro 5); 1 = no guidance", default=-1.0, min=-1.0, max=100.0, step=0.1),
        Widget("temperature", "FLOAT", "sampling temperature; 1.0 as in the papers, 0 = greedy", default=1.0,
               min=0.0, max=10.0, step=0.05),
        Widget("top_k", "INT", "keep the k most likely tokens; 0 = the model's recommended value (demo 256, "
               "Emu3 2048, Janus-Pro 1000)", default=0, min=0, max=INT_MAX, step=1),
        Widget("top_p", "FLOAT", "nucleus sampling; 1.0 = off (the papers' setting)", default=1.0, min=0.01,
               max=1.0, step=0.01),
    ]
    inputs += backend_param_widgets()
    inputs.append(Widget("batch_size", "INT", "images generated at once, each with its own random stream",
                         default=1, min=1, max=64, step=1))
    return NodeSpec(
        node_id="SpecARSampler",
        display_name="SpecAR Sampler",
        description=("Generate an image with lossless speculative decoding: every backend samples exactly what "
                     "plain AR sampling does, in fewer forward passes. Shows the speed-up on the node."),
        inputs=inputs,
        outputs=[
            Output("image", "IMAGE", "the generated images [B,H,W,C]"),
            Output("tokens", TOKENS_TYPE, "the image tokens, for SpecAR Decode Tokens or later nodes"),
            Output("stats", "STRING", "generation statistics as JSON: forward passes, step compression, latency, "
                   "accepted lengths"),
            Output("acceptance_heatmap", "IMAGE", "per token: how many tokens the step that committed it accepted "
                   "(dark: one, yellow: the longest accepted runs)"),
        ],
        output_node=True,
    )


def decode_spec() -> NodeSpec:
    return NodeSpec(
        node_id="SpecARDecode",
        display_name="SpecAR Decode Tokens",
        description="Decode SpecAR image tokens to an image with the model's own image decoder (VQ).",
        inputs=[Widget("tokens", TOKENS_TYPE, "the tokens output of a SpecAR Sampler")],
        outputs=[Output("image", "IMAGE", "the decoded images [B,H,W,C]")],
    )


__all__ = ["CATEGORY", "NodeSpec", "Output", "Widget", "backend_param_widgets", "backend_values", "decode_spec",
           "loader_spec", "sampler_spec", "validate"]
