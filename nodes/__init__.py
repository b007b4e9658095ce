"""ComfyUI nodes of SpecAR: thin wrappers over the library. Its modules, and which classes `NODE_CLASS_MAPPINGS`
holds (the V3 ones under a ComfyUI with the V3 DynamicCombo, else the V1 ones; importing this package never needs
ComfyUI): docs/NODES.md, "How the pack is built" and "Nodes" (its Validation paragraph). No `comfy_entrypoint`:
ComfyUI reads it only from a pack without NODE_CLASS_MAPPINGS (nodes.py load_custom_node)."""
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
prompt_guard.register(NODE_CLASS_MAPPINGS, dynamic=NODE_API == "v3")  # inside ComfyUI: refusals on the prompt as posted


__all__ = ["NODE_API", "NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "NODES"]
