"""The sampler's values in every layout ComfyUI has saved or sent them in, mapped by name (never by
position): the one place for layout mapping and legacy migration on the Python side (web/specar_layouts.js
is the browser's).

- nested: ComfyUI with the V3 DynamicCombo (>= 0.4.0) hands a node {"backend": {"backend": "sjd",
  "window": 32}}; its API prompts spell that "backend": "sjd", "backend.window": 32 (`nest_dotted`);
- flat: ComfyUI without DynamicCombo (0.3.x) and the V1 nodes: "backend": "sjd", "sjd_window": 32,
  every backend's inputs present (tests/support/workflows.py writes both layouts of the example workflows);
- SpecAR 0.1 API prompts: shared parameter names ("window"), where 0 meant the backend's default,
  cfg_scale -1 and top_k 0 the model's (`legacy_settings`); prompts saved before the sampling switch: temperature -1
  and top_p 0 the model's (`sampling`; prompt_guard.py moves them into the switch of a prompt posted to ComfyUI).

`sampler_settings` reads any of them into `SamplerSettings`, what `generate` takes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..samplers import backends as _backends
from ..samplers.sampling import SamplingParams, check_sampling
from . import spec
from .widgets import choice_error

GUIDANCES = (spec.MODEL_DEFAULT, "custom")
# the sampler's widget names before per-backend inputs (workflows saved up to SpecAR 0.1)
LEGACY_PARAMS = ("window", "init", "coupling", "coupling_strength", "tree_depth", "tree_width", "continuation")


@dataclass(frozen=True)
class SamplerSettings:
    """The sampler node's values, whatever layout they came in: what `generate` takes."""
    backend: str
    params: dict  # the backend's parameters (drafter folder names not yet resolved to paths)
    # generate's sampling=: a None field is the model's recommended value (resolved by generate); top_k 0: no top-k
    sampling: SamplingParams


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


def _chosen(values: dict, name: str) -> tuple:
    """(the switch's choice, its option's values when nested, else None) of a switch `name`."""
    value = values.get(name)
    if isinstance(value, dict):
        option = dict(value)
        return option.pop(name, None), option
    return value, None


def _schema(backend):
    err = choice_error("backend", _backends.SCHEMAS, backend)
    if err:
        raise ValueError(err)
    return _backends.SCHEMAS[backend]


def sampler_settings(values: dict) -> SamplerSettings:
    """Read the sampler's values in any layout (nested, dotted, flat or SpecAR 0.1); ValueError names a
    bad backend or guidance."""
    values = nest_dotted(values)
    if values.get("guidance") is None and any(k in values for k in LEGACY_PARAMS + ("cfg_scale",)):
        return legacy_settings(values)
    backend, params = _chosen(values, "backend")
    schema = _schema(backend)
    if params is None:
        params = {p.name: values[f"{backend}_{p.name}"] for p in schema.params if f"{backend}_{p.name}" in values}
    for p in schema.params:
        if p.folder_of and params.get(p.name) == spec.BESIDE_MODEL:
            params[p.name] = ""
    guidance, custom = _chosen(values, "guidance")
    err = choice_error("guidance", GUIDANCES, guidance)  # a dropped DynamicCombo is never a silent default
    if err:
        raise ValueError(err)
    if guidance == spec.MODEL_DEFAULT:
        return SamplerSettings(backend, params, sampling(values, None, None))
    custom = values if custom is None else custom
    return SamplerSettings(backend, params, sampling(values, float(custom["cfg_scale"]), custom["top_k"]))


def sampling(values: dict, cfg_scale: Optional[float], top_k: Optional[int], old: bool = False) -> SamplingParams:
    """The sampler's sampling settings, None for the model's recommended value: temperature and top_p from the
    sampling switch (none at "model default"); values saved before it (no switch) as they meant then, -1 and 0 the
    model's (spec.MODEL_TEMPERATURE, spec.MODEL_TOP_P); ValueError for a negative temperature other than -1."""
    choice, custom = _chosen(values, "sampling")
    if choice is None and (old or "temperature" in values or "top_p" in values):  # saved before the switch
        t, p = float(values.get("temperature", spec.MODEL_TEMPERATURE)), float(values.get("top_p", spec.MODEL_TOP_P))
        t = None if t == spec.MODEL_TEMPERATURE else check_sampling("temperature", t)
        return SamplingParams(cfg_scale, t, top_k, None if p == spec.MODEL_TOP_P else p)
    err = choice_error("sampling", GUIDANCES, choice)  # a dropped DynamicCombo is never a silent default
    if err:
        raise ValueError(err)
    custom = values if custom is None else custom
    if choice == spec.MODEL_DEFAULT:
        return SamplingParams(cfg_scale, None, top_k, None)
    return SamplingParams(cfg_scale, float(custom["temperature"]), top_k, float(custom["top_p"]))


def legacy_settings(values: dict) -> SamplerSettings:
    """A SpecAR 0.1 API prompt: shared parameter names, 0 = the backend's default for an integer,
    cfg_scale < 0 and top_k 0 = the model's values."""
    backend = values.get("backend")
    schema = _schema(backend)
    params = {p.name: values[p.name] for p in schema.params
              if p.name in values and not (p.kind is int and values[p.name] == 0)}
    cfg, top_k = values.get("cfg_scale", -1), values.get("top_k", 0)
    return SamplerSettings(backend, params, sampling(values, None if cfg < 0 else float(cfg), top_k or None, old=True))


def flat_prompt_on_dynamic(prompt) -> Optional[str]:
    """The error for an API prompt in the flat layout (example_workflows/api/flat/: "sjd_pac_window" keys)
    sent to a ComfyUI with DynamicCombo, or None. There ComfyUI fails every sampler whose backend has
    parameters ("Required input is missing: backend.window") and still runs the others (AR), silently;
    the sampler that runs sees the whole prompt (an output node's hidden PROMPT) and refuses it."""
    if not isinstance(prompt, dict):
        return None
    flat_names = {f"{b}_{p.name}" for b, schema in _backends.SCHEMAS.items() for p in schema.params}
    for node in prompt.values():
        inputs = node.get("inputs", {}) if isinstance(node, dict) else {}
        if node.get("class_type") != "SpecARSampler" or any(k.startswith("backend.") for k in inputs):
            continue
        flat = sorted(k for k in inputs if k in flat_names)
        if flat:
            return (f"this prompt is in the flat layout of a ComfyUI without DynamicCombo ({flat[0]}, ...: "
                    "example_workflows/api/flat/), but this ComfyUI has DynamicCombo: its samplers other than AR "
                    "fail validation and would not run. Post the DynamicCombo twin instead: example_workflows/api/"
                    "<the same name>.json (backend.window keys)")
    return None
