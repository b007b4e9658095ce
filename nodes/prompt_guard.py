"""Checks on the prompt as posted, for the refusals ComfyUI's own validation cannot file once (which ones:
docs/NODES.md, "Nodes", Validation), and the one migration of a prompt saved before the sampling switch
(`migrate_sampling`).

ComfyUI files a node's validate function's verdict under every input the function takes (execution.validate_inputs),
and turns a BOOLEAN input's value into ``bool(value)`` before any node sees it ("false" would run as on). So
`check_prompt`, an on-prompt handler (it runs before ComfyUI's validation), notes per SpecAR node id the first
refusal of the prompt as posted, and the node's validate function, which takes one input, returns it (`refusal`, by
the node's hidden unique id): ComfyUI refuses the prompt with HTTP 400 and the message once."""
from __future__ import annotations

import inspect
import logging
from typing import Optional

_refused: dict = {}  # node id (str) -> message, for the prompt posted last
_switches_dropped: list = []  # [True] where the sampler's switches are DynamicCombos (ComfyUI drops a bad value)
_classes: dict = {}  # the registered node classes that have refusals, by name
_own_validators: dict = {}  # class -> its own validate function (file_under swaps it per prompt)


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


def sampler_refusal(inputs: dict) -> Optional[tuple]:
    from . import spec
    from ..samplers.drafters.params import Param
    from .widgets import Switch, input_error
    node = spec.sampler_spec()
    for w in node.inputs if _switches_dropped else ():  # flat: a plain combo, which ComfyUI checks itself
        if isinstance(w, Switch) and w.name in inputs and not isinstance(inputs[w.name], list):
            err = w.choice_error(inputs[w.name])
            if err:
                return w.name, err
    booleans = _boolean_inputs(node)
    for name, value in inputs.items():
        err = None if name not in booleans or isinstance(value, list) else input_error(Param(name, False, ""), value)
        if err:
            return name, f"{err} (ComfyUI would run any other value as on)"
    return None


def loader_refusal(inputs: dict) -> Optional[tuple]:
    from . import models, spec
    if isinstance(inputs.get("model"), list) or inputs.get("model") not in models.model_choices():
        return None  # the model's own check: ComfyUI's (V1 combo) or the validate function's (V3, which takes it)
    widgets = spec.loader_spec(list).inputs
    values = {w.name: _posted(inputs, w.name, w.default) for w in widgets}
    if any(w.check(values[w.name]) for w in widgets if w.name in ("resolution", "quantize", "offload")):
        return None  # a value in none of the lists: ComfyUI's own check refuses it, under its input
    err = models.loader_error(values["model"], values["resolution"], values["quantize"], values["offload"])
    return err and (err.split(" ", 1)[0], err)  # the input it names first: resolution, offload or quantize


CHECKS = {"SpecARSampler": sampler_refusal, "SpecARModelLoader": loader_refusal}


def migrate_sampling(inputs: dict) -> None:
    """A sampler prompt saved before the sampling switch (temperature and top_p beside the other inputs, -1 and 0 for
    the model's values) moved into the switch, as this ComfyUI lays it out; a mixed pair (-1 beside a top_p of its
    own) is left for ComfyUI to refuse, naming the missing switch."""
    from .spec import MODEL_DEFAULT, MODEL_TEMPERATURE, MODEL_TOP_P
    t, p = inputs.get("temperature", MODEL_TEMPERATURE), inputs.get("top_p", MODEL_TOP_P)
    if "sampling" in inputs or isinstance(t, list) or isinstance(p, list) or \
            (t == MODEL_TEMPERATURE) != (p == MODEL_TOP_P):
        return
    custom = t != MODEL_TEMPERATURE
    inputs["sampling"] = "custom" if custom else MODEL_DEFAULT
    if _switches_dropped:  # a DynamicCombo: the chosen option's inputs only, "sampling.<input>"
        inputs.pop("temperature", None)
        inputs.pop("top_p", None)
        inputs.update({"sampling.temperature": t, "sampling.top_p": p} if custom else {})
    elif not custom:
        inputs.update(temperature=1.0, top_p=1.0)  # flat: the custom option's inputs, unused at "model default"


def check_prompt(json_data):
    """The on-prompt handler: returns `json_data` (a sampler saved before the sampling switch migrated), noting each
    SpecAR node's refusal, filed under its input (`file_under`)."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    nodes = {}  # class name -> [(input, message) or None: each node's refusal]
    for nid, node in (prompt.items() if isinstance(prompt, dict) else ()):
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            continue
        if node.get("class_type") == "SpecARSampler":
            migrate_sampling(node["inputs"])
        check = CHECKS.get(str(node.get("class_type")))
        found = check(node["inputs"]) if check else None
        _refused.pop(str(nid), None)
        if found:
            _refused[str(nid)] = found[1]
        nodes.setdefault(node.get("class_type"), []).append(found)
    for name, cls in _classes.items():
        found = nodes.get(name, [])
        file_under(cls, found[0] if len(found) == 1 else None)
    return json_data


def file_under(cls, refused: Optional[tuple]) -> None:
    """Have ComfyUI file this prompt's refusal of its one `cls` node under the input it is about: where the prompt
    has one node of the class, refused about a plain input (not a switch: ComfyUI drops a DynamicCombo value that is
    none of its options), the validate function names that input for this prompt; otherwise it is the class's own."""
    from . import spec
    from .widgets import Switch, flatten
    attr = "validate_inputs" if hasattr(cls, "define_schema") else "VALIDATE_INPUTS"
    own = _own_validators.setdefault(cls, cls.__dict__[attr])
    node = spec.sampler_spec() if cls.__name__ == "SpecARSampler" else spec.loader_spec(list)
    plain = {w.name for w in flatten(node.inputs)} - {w.name for w in node.inputs if isinstance(w, Switch)}
    if refused is None or refused[0] not in plain:
        setattr(cls, attr, own)
        return
    name, message = refused

    def validate(cls, **values):
        return message
    validate.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                                for n in ("cls", name)])
    setattr(cls, attr, classmethod(validate))


def refusal(unique_id) -> Optional[str]:
    """The message for this node of the prompt posted last, or None."""
    return None if unique_id is None else _refused.get(str(unique_id))


def register(classes: dict, dynamic: bool = False) -> None:
    """Install `check_prompt` in a running ComfyUI (no-op without one) for the node `classes` ({name: class}).
    `dynamic`: the sampler's switches are DynamicCombos, whose values ComfyUI drops when they are none of the options."""
    _switches_dropped[:] = [True] if dynamic else []
    _classes.clear()
    _classes.update({n: c for n, c in classes.items() if n in CHECKS})
    from .models import comfy_server
    server = comfy_server()
    if server is not None and check_prompt not in getattr(server, "on_prompt_handlers", ()):
        try:
            server.add_on_prompt_handler(check_prompt)
        except AttributeError as e:  # a ComfyUI without on-prompt handlers: the nodes still work
            logging.getLogger("specar").info("SpecAR: no on-prompt handler (%s)", e)
