"""On/off inputs given anything but true / false through the HTTP API.

ComfyUI's validation turns the value of a BOOLEAN input into ``bool(value)`` before any node sees it, so
"false" or "no" would run as on. The check therefore reads the prompt as posted: `check_prompt` is a
PromptServer on-prompt handler (it runs before ComfyUI's validation) that notes, per node id, the first
on/off input of a SpecAR node holding something else; the node's own validation (`refusal`, by its hidden
unique id) then refuses the prompt at queue time with that message.
"""
from __future__ import annotations

import logging
from typing import Optional

_refused: dict = {}  # node id (str) -> message, for the prompt posted last


def _boolean_inputs(class_type: str) -> set:
    """The on/off inputs of a SpecAR node by their API names: flat, and "<switch>.<input>" (DynamicCombo)."""
    from . import spec
    from .widgets import Switch
    node = {"SpecARSampler": spec.sampler_spec, "SpecARModelLoader": lambda: spec.loader_spec(list)}.get(class_type)
    if node is None:
        return set()
    names = set()
    for w in node().inputs:
        if isinstance(w, Switch):
            for key, widgets in w.options.items():
                names |= {n for x in widgets if x.kind == "BOOLEAN"
                          for n in (w.flat_name(key, x), f"{w.name}.{x.name}")}
        elif w.kind == "BOOLEAN":
            names.add(w.name)
    return names


def check_prompt(json_data):
    """The on-prompt handler: returns `json_data` unchanged, noting each SpecAR node whose on/off input is not a
    boolean (a link, [node, output], is the other node's business)."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    booleans = {}
    for nid, node in (prompt.items() if isinstance(prompt, dict) else ()):
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            continue
        kind = str(node.get("class_type"))
        if kind not in booleans:
            booleans[kind] = _boolean_inputs(kind)
        bad = [f"{name} must be true or false, got {value!r}" for name, value in node["inputs"].items()
               if name in booleans[kind] and not isinstance(value, (bool, list))]
        if bad:
            _refused[str(nid)] = bad[0] + " (ComfyUI would run any other value as on)"
        else:
            _refused.pop(str(nid), None)
    return json_data


def refusal(unique_id) -> Optional[str]:
    """The message for this node of the prompt posted last, or None."""
    return None if unique_id is None else _refused.get(str(unique_id))


def register() -> None:
    """Install `check_prompt` in a running ComfyUI (no-op without one)."""
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
