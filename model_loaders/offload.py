"""``offload="auto"`` for every family (docs/MODELS.md, "Memory"): whole decoder layers on the model's device, the
CPU, then disk, brought in per forward by hooks; the rest stays on the device (the adapters read it: ``.weight``)."""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref


def placement(layers: str, device_map, device, dtype, max_memory=None):
    """A function of the meta-device net: its device map (of the module list `layers` by accelerate, in `max_memory`
    or the free memory; kept as ``hf_device_map``) -> {tensor name: its module's GPU, or "cpu" if offloaded}."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes, get_max_memory

    if device_map != "auto":
        raise ValueError(f"device_map must be 'auto' (accelerate places whole decoder layers), got {device_map!r}")
    main = (device.index or 0) if device.type == "cuda" else device.type
    limits = get_max_memory(None if max_memory is None else dict(max_memory))
    others = [k for k in limits if k not in (main, "cpu", "disk")]
    if others and max_memory is not None:
        raise ValueError(f"max_memory names {others}: offload runs every layer on {device}, where the KV cache is, "
                         f"so it may name {main!r}, 'cpu' and 'disk' only")
    keep = 0.9 if max_memory is None else 1  # unless told: a tenth kept for KV cache, activations (as transformers)
    limits = {k: int(v * keep) for k, v in limits.items() if k not in others}

    def plan(net) -> dict:
        stack, sizes = net.get_submodule(layers), compute_module_sizes(net, dtype=dtype)
        rest = sizes[""] - sizes[layers]
        need = rest + max(sizes[f"{layers}.{i}"] for i in range(len(stack)))
        if limits.get(main, 0) < need:
            raise ValueError(f"offload: max_memory[{main!r}] is {limits.get(main, 0)} bytes; the model needs at least "
                             f"{need} there (what stays on {device}: embeddings, heads, the VQ model, and room to "
                             f"bring one decoder layer in); allowed: a cap of {need} bytes or more")
        left = {k: v - rest * (k == main) for k, v in limits.items()}
        placed = infer_auto_device_map(stack, left, no_split_module_classes=[type(stack[0]).__name__], dtype=dtype)
        net.hf_device_map = rest_of(net, layers, main) | {f"{layers}.{k}".rstrip("."): v for k, v in placed.items()}
        return {name: "cpu" if where in ("cpu", "disk") else where for module, where in net.hf_device_map.items()
                for name, _ in net.get_submodule(module).named_parameters(prefix=module)}
    return plan


def rest_of(net, layers: str, main) -> dict:
    """{name: `main`} for every module and tensor of `net` outside the module `layers` and its ancestors."""
    out, prefix, module = {}, "", net
    for part in layers.split("."):
        for name, _ in [*module.named_children(), *module.named_parameters(recurse=False),
                        *module.named_buffers(recurse=False)]:
            if name != part:
                out[prefix + name] = main
        module, prefix = module.get_submodule(part), f"{prefix}{part}."
    return out


def scratch_folder(offload_folder=None) -> str:
    """A new folder in `offload_folder` (else the system's temporary one: accelerate would reuse an earlier
    model's) for what goes on disk; `remove_with` the model."""
    if offload_folder is not None:
        os.makedirs(offload_folder, exist_ok=True)
    return tempfile.mkdtemp(prefix="specar-offload-", dir=offload_folder)


def remove_with(net, folder: str):
    weakref.finalize(net, shutil.rmtree, folder, True)
    return net


def dispatch(net, device, offload_folder=None):
    """`net` (placed by `placement`) under accelerate's hooks, what is on disk in a `scratch_folder`."""
    from accelerate import dispatch_model

    folder = scratch_folder(offload_folder)
    return remove_with(dispatch_model(net, net.hf_device_map, main_device=device, offload_dir=folder), folder)
