"""The nodes' inputs and outputs, declared once, ComfyUI-free.

Both node flavours are generated from these declarations: the V3 classes (`v3.py`, ComfyUI's
`comfy_api.latest` schema) and the V1 classes (`v1.py`, `INPUT_TYPES` dictionaries), so the two
cannot drift apart. Each backend's parameters are built from its schema in samplers/backends.py
(default, range, choices, the paper's setting): a backend registered there appears on the sampler
node with its own inputs and no change here. The backend and the guidance are `Switch`es: ComfyUI's
V3 DynamicCombo where available (only the chosen option's inputs exist), else flattened.

Validation: the widgets declare their ranges and choices, so ComfyUI files a bad value against the
input that has it, once; no validate function takes every input (that makes ComfyUI file its message
once per input): the V3 sampler's names only the switches (nodes/v3.py). `validate(inputs, values)` checks the same
ranges again when a node runs (ComfyUI does not check V3 combo values everywhere), and cross-parameter
and model-dependent limits are checked then, once, before generating.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Union

from ..model_loaders.resolutions import MODEL_DEFAULT as MODEL_DEFAULT_SIZE
from ..model_loaders.resolutions import OFFLOADS, RESOLUTIONS
from ..samplers import backends as _backends
from ..samplers.backends import BACKEND_PARAMS, COUPLINGS, INITS, MAX_WINDOW

CATEGORY = "SpecAR"
SEED_MAX = 0xFFFFFFFFFFFFFFFF
INT_MAX = 2**31 - 1
MODEL_TYPE = "SPECAR_MODEL"
DRAFTER_FOLDER = "specar_drafters"  # ComfyUI/models/specar_drafters/<drafter folder>
TOKENS_TYPE = "SPECAR_TOKENS"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
CONTROL_AFTER_GENERATE = ("fixed", "increment", "decrement", "randomize")
PREVIEW_MODES = ("image", "image + acceptance", "off")


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
    extra: dict = field(default_factory=dict)  # more keys of the input's options, for the web extension

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
        """The widgets in the flat layout (V1; V3 without DynamicCombo), in order."""
        return [w for w in flatten(self.inputs) if w.is_widget]


def validate(inputs: list, values: dict) -> Optional[str]:
    """The first error among the widget values present in `values` (absent or None = linked: skipped);
    a Switch's inputs are checked for its chosen option only, flat or nested (V3 DynamicCombo)."""
    values = nest_dotted(values)
    for w in inputs:
        err = None
        if isinstance(w, Switch):
            err = w.check(values)
        elif w.is_widget and values.get(w.name) is not None:
            err = w.check(values[w.name])
        if err:
            return err
    return None


# ---------------------------------------------------------------------------------------------
# switches: a combo whose choice decides which further inputs apply

@dataclass
class Switch:
    """A choice that decides which further inputs apply: the backend (each backend has its own
    parameters) and the guidance ("model default" or custom values).

    Rendered as ComfyUI's V3 DynamicCombo where the running ComfyUI has it (only the chosen
    option's inputs exist); elsewhere as a combo followed by every option's inputs, flattened
    (`flat_name`), which the web extension hides unless their option is chosen."""
    name: str
    tooltip: str
    default: str
    options: dict  # option key -> [Widget] (its inputs, named without prefix)
    prefix: bool = False  # flattened names: "<option>_<input>" (options share input names) or the input's own
    kind: str = "SWITCH"

    is_widget = True

    def flat_name(self, key: str, w: Widget) -> str:
        return f"{key}_{w.name}" if self.prefix else w.name

    labels: dict = field(default_factory=dict)  # option key -> readable name (the web extension's node title)

    def combo(self) -> Widget:
        extra = {"specar_labels": dict(self.labels)} if self.labels else {}
        return Widget(self.name, "COMBO", self.tooltip, default=self.default, options=tuple(self.options), extra=extra)

    def check(self, values: dict) -> Optional[str]:
        """None if the choice and its option's inputs in `values` are valid (flat or nested layout)."""
        value = values.get(self.name)
        if value is None:
            return None
        nested = isinstance(value, dict)
        key = value.get(self.name) if nested else value
        err = self.combo().check(key)
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


# ---------------------------------------------------------------------------------------------
# backend parameters -> widgets (each backend's own, with its real default)

BESIDE_MODEL = "(beside the model)"  # drafter folder choice: the drafter shipped next to the model's weights
# the inputs each backend shows first; the others are advanced (the web extension shows them on request).
# A backend not listed here (or a parameter added later) shows everything.
ESSENTIAL_PARAMS = {
    "sjd": ("window",),
    "scd": ("window", "coupling"),
    "sjd_pac": ("window", "tree_depth", "tree_width"),
    "auto": ("max_window",),
    "hawk": ("heads", "node_budget", "candidates"),
    "adt_tree": ("drafter", "node_budget", "tree_shape", "candidate_mode", "relaxed"),
}


def is_advanced(backend: str, param: str) -> bool:
    return backend in ESSENTIAL_PARAMS and param not in ESSENTIAL_PARAMS[backend]


def param_widget(p, label: str, drafter_choices: Callable[[str], list]) -> Widget:
    """The widget of one backend parameter (samplers/backends.py Param), default and range from its schema."""
    tooltip = f"{label}: {p.help}. Default {p.default}"
    if p.paper:
        tooltip += f"; {p.paper}"
    tooltip += "."
    if p.folder_of:
        return Widget(p.name, "COMBO", tooltip.replace(f"Default {p.default}", f"Default {BESIDE_MODEL}") +
                      f" Folders with {p.folder_of} drafters under ComfyUI/models/{DRAFTER_FOLDER} are listed.",
                      default=BESIDE_MODEL, options=lambda kind=p.folder_of: [BESIDE_MODEL] + drafter_choices(kind))
    if isinstance(p.default, bool):
        return Widget(p.name, "BOOLEAN", tooltip, default=p.default)
    if isinstance(p.default, int):
        return Widget(p.name, "INT", tooltip, default=p.default, min=int(p.lo), max=INT_MAX if p.hi is None else
                      int(p.hi), step=1)
    if isinstance(p.default, float):
        step = 0.01 if p.hi is not None and p.hi <= 1 else 0.05
        return Widget(p.name, "FLOAT", tooltip, default=p.default, min=p.lo, max=p.hi, step=step)
    if p.choices:
        return Widget(p.name, "COMBO", tooltip, default=p.default, options=tuple(p.choices))
    return Widget(p.name, "STRING", tooltip, default=p.default)


def backend_switch(drafter_choices: Callable[[str], list] = lambda kind: []) -> Switch:
    schemas = _backends.SCHEMAS  # read each time: a backend registered later appears too
    names = tuple(schemas)
    help_text = "; ".join(f"{s.label}: {s.summary}" for s in schemas.values())
    return Switch(
        "backend", f"how tokens are drafted and verified. {help_text}. Every lossless backend samples exactly what AR "
        "samples; only the chosen backend's parameters are shown.", default="auto" if "auto" in names
        else names[0], prefix=True,
        labels={n: s.label for n, s in schemas.items()},
        options={n: [advanced(param_widget(p, s.label, drafter_choices), is_advanced(n, p.name)) for p in s.params]
                 for n, s in schemas.items()})


def advanced(w: Widget, flag: bool) -> Widget:
    if flag:
        w.extra = {**w.extra, "specar_advanced": True}
    return w


MODEL_DEFAULT = "model default"
GUIDANCE_HELP = ("classifier-free guidance and top-k: the model's recommended values (demo: cfg 3, top-k 256; "
                 "Janus-Pro: 5, 1000; Emu3: 3, 2048; Lumina-mGPT: 3, 2000; Anole: 3, 2000; LlamaGen c2i: 4, "
                 "2000; the values used are shown after the run) or custom values")


def guidance_switch() -> Switch:
    return Switch("guidance", GUIDANCE_HELP, default=MODEL_DEFAULT, options={
        MODEL_DEFAULT: [],
        "custom": [
            Widget("cfg_scale", "FLOAT", "classifier-free guidance scale: 1 = no guidance, higher = closer to the "
                   "prompt (0 = the unconditional branch alone)", default=3.0, min=0.0, max=100.0, step=0.1),
            Widget("top_k", "INT", "keep the k most likely image tokens (0 = all tokens; at most the model's "
                   "image vocabulary, checked when the node runs)", default=256, min=0, max=INT_MAX, step=1),
        ]})


@dataclass
class SamplerSettings:
    """The sampler node's values, whatever layout they came in: what `generate` takes."""
    backend: str
    params: dict  # the backend's parameters (drafter folder names not yet resolved to paths)
    cfg_scale: Optional[float]  # None: the model's recommended value
    top_k: Optional[int]


# the sampler's widget names before per-backend inputs (workflows saved up to SpecAR 0.1): shared backend
# parameter names where 0 meant "the backend's default", cfg_scale -1 and top_k 0 "the model's"
LEGACY_PARAMS = ("window", "init", "coupling", "coupling_strength", "tree_depth", "tree_width", "continuation")


def nest_dotted(values: dict) -> dict:
    """API-format DynamicCombo keys ("backend": "sjd", "backend.window": 32) as ComfyUI nests them
    before a node runs ({"backend": {"backend": "sjd", "window": 32}}); other values unchanged."""
    if not any("." in k for k in values):
        return values
    out = {k: v for k, v in values.items() if "." not in k}
    for key, value in values.items():
        if "." in key:
            head, _, rest = key.partition(".")
            group = out.get(head)
            if not isinstance(group, dict):
                group = out[head] = {head: group}
            group[rest] = value
    return out


def sampler_settings(values: dict) -> SamplerSettings:
    """Read the sampler's values in any layout: nested (V3 DynamicCombo: backend = {"backend": name,
    param: value}), flat ("backend" + "<backend>_<param>") or legacy (SpecAR 0.1 API prompts: shared
    parameter names, sentinels). ValueError names a bad backend."""
    values = nest_dotted(values)
    backend = values.get("backend")
    if isinstance(backend, dict):  # V3 DynamicCombo: the chosen option and its inputs
        nested = dict(backend)
        backend = nested.pop("backend", None)
        params = nested
    else:
        params = None
    if backend not in _backends.SCHEMAS:
        raise ValueError(f"backend must be one of {', '.join(_backends.SCHEMAS)}; got {backend!r}")
    schema = _backends.SCHEMAS[backend]
    if params is None:
        params = {p.name: values[f"{backend}_{p.name}"] for p in schema.params if f"{backend}_{p.name}" in values}
        if not params and any(k in values for k in LEGACY_PARAMS):  # SpecAR 0.1: shared names, 0 = default
            params = {p.name: values[p.name] for p in schema.params
                      if p.name in values and not (p.kind is int and values[p.name] == 0)}
    for p in schema.params:
        if p.folder_of and params.get(p.name) == BESIDE_MODEL:
            params[p.name] = ""
    guidance = values.get("guidance")
    if guidance is None and "cfg_scale" in values:  # SpecAR 0.1: cfg_scale < 0 / top_k 0 = the model's
        cfg, top_k = values["cfg_scale"], values.get("top_k", 0)
        return SamplerSettings(backend, params, None if cfg < 0 else float(cfg), None if top_k == 0 else top_k)
    custom = guidance if isinstance(guidance, dict) else values  # nested (V3 DynamicCombo) or flat
    if isinstance(guidance, dict):
        guidance = guidance.get("guidance")
    if guidance is None and not any(k in values for k in LEGACY_PARAMS):
        # ComfyUI drops a DynamicCombo whose value is none of its options: never a silent default
        raise ValueError(f"guidance must be one of {MODEL_DEFAULT}, custom; got none (a value that is not an option)")
    if guidance in (None, MODEL_DEFAULT):
        return SamplerSettings(backend, params, None, None)
    if guidance != "custom":
        raise ValueError(f"guidance must be one of {MODEL_DEFAULT}, custom; got {guidance!r}")
    top_k = custom["top_k"]
    return SamplerSettings(backend, params, float(custom["cfg_scale"]), None if top_k == 0 else top_k)  # 0: all


BACKEND_HELP = {name: schema.summary for name, schema in _backends.SCHEMAS.items()}


# ---------------------------------------------------------------------------------------------
# the nodes

def loader_spec(model_choices: Callable[[], list]) -> NodeSpec:
    return NodeSpec(
        node_id="SpecARModelLoader",
        display_name="SpecAR Model Loader",
        description=("Load an autoregressive image model: the embedded demo model, or a model folder under "
                     "ComfyUI/models/specar (family recognised from its files). The model stays loaded across runs; "
                     "ComfyUI's Unload Models and memory pressure free it, and the next run loads it again."),
        inputs=[
            Widget("model", "COMBO", "demo: the small model shipped with SpecAR (runs on a CPU); other entries: "
                   "model folders under ComfyUI/models/specar (Janus / Janus-Pro, Emu3, Lumina-mGPT, Anole in "
                   "transformers format; LlamaGen as its authors' checkpoints)", default="demo",
                   options=model_choices),
            Widget("device", "COMBO", "where the model runs; auto: ComfyUI's device", default="auto",
                   options=DEVICES),
            Widget("dtype", "COMBO", "weights precision; auto: the model's recommended one (float32 on CPU)",
                   default="auto", options=DTYPES),
            # new inputs go after the old ones: saved workflows keep their positional values
            Widget("resolution", "COMBO", "image size in pixels (W x H): model default, or a size the family offers "
                   "(Janus-Pro 384x384 only; Emu3 any; Lumina-mGPT its 512 / 768 / 1024 sizes; Anole 512x512; "
                   "LlamaGen 256 / 384 / 512 squares); another size is refused naming what the model offers",
                   default=MODEL_DEFAULT_SIZE, options=RESOLUTIONS, optional=True),
            Widget("offload", "COMBO", "none: every weight on the device; auto: accelerate's big-model loading (GPU "
                   "first, the rest in CPU memory) for models larger than the GPU (transformers-format families)",
                   default="none", options=OFFLOADS, optional=True),
        ],
        outputs=[Output("model", MODEL_TYPE, "the loaded model, cached across runs")],
    )


def sampler_spec(drafter_choices: Callable[[str], list] = lambda kind: []) -> NodeSpec:
    inputs = [
        Widget("model", MODEL_TYPE, "from the SpecAR Model Loader"),
        Widget("prompt", "STRING", "what to draw", default="a large red circle on a blue background",
               multiline=True),
        Widget("negative_prompt", "STRING", "the unconditional branch of classifier-free guidance "
               "(empty: the model's default)", default="", multiline=True),
        Widget("seed", "INT", "random seed: the same seed, sampling settings and backend give the same image; "
               "lossless backends sample the same distribution as AR", default=0, min=0, max=SEED_MAX,
               control_after_generate=True),
        backend_switch(drafter_choices),
        guidance_switch(),
        Widget("temperature", "FLOAT", "sampling temperature; 1.0 as in the papers, 0 = greedy", default=1.0,
               min=0.0, max=10.0, step=0.05),
        Widget("top_p", "FLOAT", "nucleus sampling; 1.0 = off (the papers' setting)", default=1.0, min=0.01,
               max=1.0, step=0.01),
        Widget("batch_size", "INT", "images generated at once, each with its own random stream (the largest "
               "batch this model allows is checked before generating)", default=1, min=1, max=64, step=1),
        Widget("preview", "COMBO", "live preview while tokens are committed: the partial image, the partial image "
               "tinted by acceptance (longer accepted runs brighter), or off", default="image",
               options=PREVIEW_MODES),
        # new inputs go last, optional: prompts and workflows saved before them keep working
        Widget("compare_with_ar", "BOOLEAN", "also run plain AR with the same model, prompt, seed, batch and guidance "
               "in this execution, and show the wall-clock speed-up against it (costs one AR generation)",
               default=False, optional=True),
    ]
    return NodeSpec(
        node_id="SpecARSampler",
        display_name="SpecAR Sampler",
        description=("Generate an image with lossless speculative decoding: every backend samples exactly what "
                     "plain AR sampling does, in fewer forward passes. Shows the measured latency and, with "
                     "compare_with_ar on, the speed-up over an AR run measured in the same execution."),
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


__all__ = ["CATEGORY", "NodeSpec", "Output", "SamplerSettings", "Switch", "Widget", "backend_switch", "decode_spec",
           "flatten", "guidance_switch", "loader_spec", "sampler_settings", "sampler_spec", "validate"]
