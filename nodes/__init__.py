"""ComfyUI nodes of SpecAR: thin wrappers over the library.

- widgets.py: the declaration language (Widget, Switch, Output, NodeSpec) and its validation;
- spec.py: the three nodes declared once (backend inputs from samplers.backends.SCHEMAS, model help
  from the model families);
- v3.py / v1.py: the V3 classes (`comfy_api.latest`, used when ComfyUI provides it) and the V1 classes
  (INPUT_TYPES), both generated from spec.py;
- models.py: the loader's side (ComfyUI model folders, the model cache, ComfyUI's model management);
- core.py: what the sampler and decode nodes do (sampling, progress, interrupt, preview);
- report.py: what the sampler shows after a run (summary line and notes, statistics JSON, acceptance heatmap);
- prompt_guard.py: on/off inputs checked on the prompt as posted (ComfyUI turns any value into a boolean);
- layouts.py: the sampler's values in every layout (DynamicCombo, flat, SpecAR 0.1), mapped by name;
- workflows.py: the example workflows, generated from spec.py.

`NODE_CLASS_MAPPINGS` holds the V3 classes under a ComfyUI with the V3 DynamicCombo (0.3.76 and newer; ComfyUI
registers the classes of NODE_CLASS_MAPPINGS whatever their API), and the V1 classes otherwise, as on the floor,
0.3.64 (importing this package never needs ComfyUI): ComfyUI 0.3.x checks the choices of V1 combos when a prompt
is queued but not those of V3 combos (a drafter folder not in the list, dtype float64 passed). No
`comfy_entrypoint`: ComfyUI reads it only from a pack without NODE_CLASS_MAPPINGS (nodes.py load_custom_node).
"""
from __future__ import annotations

import logging

from . import models, prompt_guard, v1

NODE_API = "v1"
NODES = list(v1.NODES)
try:
    from comfy_api.latest import io as _io
except Exception:  # no ComfyUI, or a ComfyUI without the V3 schema
    _io = None
if _io is not None:
    try:
        from .v3 import build_nodes, dynamic_combo_available

        if dynamic_combo_available(_io):
            NODES = build_nodes(_io)
            NODE_API = "v3"
    except Exception as e:  # an incompatible comfy_api: the V1 classes still work
        logging.getLogger("specar").warning("SpecAR: V3 nodes unavailable (%s); using the V1 nodes", e)

NODE_CLASS_MAPPINGS = {cls.__name__: cls for cls in NODES}
NODE_DISPLAY_NAME_MAPPINGS = dict(v1.NODE_DISPLAY_NAME_MAPPINGS)

models.register_model_folder()  # inside ComfyUI: models/specar becomes a model folder (no-op without it)
prompt_guard.register(dynamic=NODE_API == "v3")  # inside ComfyUI: the refusals checked on the prompt as posted


__all__ = ["NODE_API", "NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "NODES"]
