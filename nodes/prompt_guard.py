"""Checks on the prompt as posted, for the refusals ComfyUI's own validation cannot file once.

ComfyUI files a node's validate function's verdict under every input the function takes
(execution.validate_inputs), and it turns the value of a BOOLEAN input into ``bool(value)`` before any node
sees it, so "false" or "no" would run as on. So `check_prompt`, a PromptServer on-prompt handler (it runs
before ComfyUI's validation), notes per SpecAR node id the first refusal of the prompt as posted:
- the sampler: a switch value that is none of its options (ComfyUI drops such a DynamicCombo value), or an
  on/off input holding anything but true / false;
- the loader: a value its chosen model does not allow (resolution, quantize, offload: `models.loader_error`).
The node's validate function, which takes one input, then returns that message (`refusal`, by the node's
hidden unique id): ComfyUI refuses the prompt with HTTP 400 and the message once. Every other bad value
(a choice not listed, a number out of range) is refused by ComfyUI itself, under its own input.
"""
from __future__ import annotations

import logging
from typing import Optional

_refused: dict = {}  # node id (str) -> message, for the prompt posted last
_switches_dropped: list = []  # [True] where the sampler's switches are DynamicCombos (ComfyUI drops a bad value)


def _boolean_inputs(node) -> set:
    """The on/off inputs of a node declaration by their API names: flat, and "<switch>.<input>" (DynamicCombo)."""
    from .widgets import Switch
    names = set()
    for w in node.inputs:
        if isinstance(w, Switch):
            for key, widgets in w.options.items():
                names |= {n for x in widgets if x.kind == "BOOLEAN"
                          for n in (w.flat_name(key, x), f"{w.name}.{x.name}")}
        elif w.kind == "BOOLEAN":
            names.add(w.name)
    return names


def _posted(inputs: dict, name: str, default=None):
    """A posted value, or `default` where it is missing or a link ([node, output]: the other node's business)."""
    value = inputs.get(name, default)
    return default if isinstance(value, list) else value


def sampler_refusal(inputs: dict) -> Optional[str]:
    from . import spec
    from ..samplers.drafters.params import Param
    from .widgets import Switch, input_error
    node = spec.sampler_spec()
    for w in node.inputs if _switches_dropped else ():  # flat: a plain combo, which ComfyUI checks itself
        if isinstance(w, Switch) and w.name in inputs and not isinstance(inputs[w.name], list):
            err = w.choice_error(inputs[w.name])
            if err:
                return err
    booleans = _boolean_inputs(node)
    for name, value in inputs.items():
        err = None if name not in booleans or isinstance(value, list) else input_error(Param(name, False, ""), value)
        if err:
            return f"{err} (ComfyUI would run any other value as on)"
    return None


def loader_refusal(inputs: dict) -> Optional[str]:
    from . import models, spec
    if isinstance(inputs.get("model"), list) or inputs.get("model") not in models.model_choices():
        return None  # the model's own check: ComfyUI's (V1 combo) or the validate function's (V3, which takes it)
    widgets = spec.loader_spec(list).inputs
    values = {w.name: _posted(inputs, w.name, w.default) for w in widgets}
    if any(w.check(values[w.name]) for w in widgets if w.name in ("resolution", "quantize", "offload")):
        return None  # a value in none of the lists: ComfyUI's own check refuses it, under its input
    return models.loader_error(values["model"], values["resolution"], values["quantize"], values["offload"])


CHECKS = {"SpecARSampler": sampler_refusal, "SpecARModelLoader": loader_refusal}


def check_prompt(json_data):
    """The on-prompt handler: returns `json_data` unchanged, noting each SpecAR node's refusal."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    for nid, node in (prompt.items() if isinstance(prompt, dict) else ()):
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            continue
        check = CHECKS.get(str(node.get("class_type")))
        err = check(node["inputs"]) if check else None
        if err:
            _refused[str(nid)] = err
        else:
            _refused.pop(str(nid), None)
    return json_data


def refusal(unique_id) -> Optional[str]:
    """The message for this node of the prompt posted last, or None."""
    return None if unique_id is None else _refused.get(str(unique_id))


def register(dynamic: bool = False) -> None:
    """Install `check_prompt` in a running ComfyUI (no-op without one). `dynamic`: the sampler's switches are
    DynamicCombos, whose values ComfyUI drops when they are none of the options."""
    _switches_dropped[:] = [True] if dynamic else []
    try:
        from server import PromptServer
        server = PromptServer.instance
    except (ImportError, AttributeError):
        return
    if check_prompt not in getattr(server, "on_prompt_handlers", ()):
        try:
            server.add_on_prompt_handler(check_prompt)
        except AttributeError as e:  # a ComfyUI without on-prompt handlers: the nodes still work
            logging.getLogger("specar").info("SpecAR: no on-prompt handler (%s)", e)


__all__ = ["check_prompt", "refusal", "register"]
