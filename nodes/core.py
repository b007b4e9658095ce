"""What the sampler and decode nodes do, as plain functions shared by the V1 and V3 node classes (the loader's side
and the model cache: models.py). ComfyUI's modules come through `models.comfy_module`, guarded: this module (and the
whole pack) imports and runs without ComfyUI."""
from __future__ import annotations

import threading
import time
import weakref
from typing import Callable, Optional

import torch

from ..samplers.compiled_step import compile_stage
from ..samplers import backends as _backends
from ..samplers.api import REPRODUCIBLE_DEFAULT, generate
from ..samplers.engine import GenerationInterrupted
from ..samplers.preview import PREVIEW_THROTTLE, PartialImage
from .layouts import nest_dotted, sampler_settings
from .models import ModelHandle, comfy_module, comfy_server, resolve, resolve_drafter, sampler_spec
from .report import heatmap, report
from .spec import shown

# the models this node pack has generated with (its own state, never written into the model object): a model's
# first generation carries one-time costs (weights paged in, calibration) that the report names
_GENERATED: "weakref.WeakSet" = weakref.WeakSet()
from .widgets import comfy_message, validate


def out_of_memory_message(values: dict, model) -> str:
    """What to lower after a CUDA out-of-memory error, for this run's settings."""
    settings = sampler_settings(values)
    size_params = _backends.SCHEMAS[settings.backend].size_params
    sizes = [f"{k}={v}" for k, v in settings.params.items() if k in size_params]
    what = [f"batch_size (now {values.get('batch_size', 1)})"]
    if sizes:
        what.append(f"the {settings.backend} draft size ({', '.join(sizes)})")
    what.append("the resolution, or load the model with offload / a smaller dtype")
    return (f"out of GPU memory while generating with {settings.backend}: lower {'; '.join(what)}. The model "
            f"is still loaded and usable.")


# ComfyUI progress bar and interrupt

STAGE_EVENT = "specar_stage"  # {"node": id, "text": a stage's text, or None when it is over}: web/specar.js shows it


def _executing_node(server) -> Optional[str]:
    """The id of the node ComfyUI is running (its execution context where it has one, else the server's last)."""
    try:
        from comfy_execution.utils import get_executing_context
        context = get_executing_context()
        if context is not None:
            return str(context.node_id)
    except (ImportError, AttributeError):
        pass
    node = getattr(server, "last_node_id", None)
    return None if node is None else str(node)


class ComfyProgress:
    """progress(done, total) -> ComfyUI's progress bar (whose every update also checks the interrupt);
    stage(text): a stage of the run that stops the bar (a compile), as the node's progress text."""

    PREVIEW_SIZE = 512  # the longest side of a preview image, as ComfyUI's own latent previews

    TICK_S = 2.0  # how often a stage's text says how long it has taken so far

    def __init__(self):
        self._utils = comfy_module("comfy.utils")
        self.bar = None
        self.last = (0, 1)
        self.staged = False
        self._ticker = None  # (thread, stop event) while a stage is shown

    def stage(self, what: Optional[str]) -> None:
        """Say on the node what the run is doing while the bar stands still (None: that stage is over): the
        statistics box explains the stage, ComfyUI's progress text under the node says only "compiling the
        <what>: N s" (short, so no frontend cuts it), and both count the seconds every TICK_S until it ends."""
        if self._ticker is not None:
            self._ticker[1].set()
            self._ticker[0].join()
            self._ticker = None
        server = comfy_server()
        self.staged = what is not None
        if server is None:
            return
        node = _executing_node(server)
        client = getattr(server, "client_id", None)
        if what is None:
            if hasattr(server, "send_progress_text"):  # a space: frontend 1.49 ignores an empty text (keeps the old)
                server.send_progress_text(" ", node)
            server.send_sync(STAGE_EVENT, {"node": node, "text": None}, client)
            return

        def send(seconds: int) -> None:
            if hasattr(server, "send_progress_text"):  # ComfyUI's own progress text under the node
                server.send_progress_text(f"compiling the {what}: {seconds} s", node)
            server.send_sync(STAGE_EVENT, {"node": node, "text": (
                f"compiling the {what} for a new shape: {seconds} s so far (the first run with this backend, size, "
                f"batch or guidance compiles once: seconds to minutes; the progress bar moves again after it)")}, client)

        send(0)
        stop, start = threading.Event(), time.monotonic()

        def tick():
            while not stop.wait(self.TICK_S):
                send(int(time.monotonic() - start))
        thread = threading.Thread(target=tick, name="specar-compile-stage", daemon=True)
        self._ticker = (thread, stop)
        thread.start()

    def __call__(self, done: int, total: int) -> None:
        self.last = (done, total)
        if self.staged:
            self.stage(None)
        if self._utils is None:
            return
        if self.bar is None:
            self.bar = self._utils.ProgressBar(total)
        self.bar.update_absolute(done, total)

    def show(self, images: list, committed: int, total: int) -> None:
        """A preview image on the node (ComfyUI's progress-bar preview: the first image of the batch)."""
        if self._utils is None or self.bar is None or not images:
            return
        # always PREVIEW_SIZE: ComfyUI scales the preview to it (up too), and frontend 1.27 draws a smaller
        # preview at its own size (a 64x64 image would be a 64 px speck on the node)
        self.bar.update_absolute(self.last[0], self.last[1], ("JPEG", images[0], self.PREVIEW_SIZE))

    def label(self, width: int, height: int) -> str:
        """What the preview on the node is: the frontend labels it with the size it was sent at, so this
        names the image's own size and the scaling. ComfyUI's server fits it into PREVIEW_SIZE squared
        with PIL's ImageOps.contain, whose rounding this repeats."""
        s = self.PREVIEW_SIZE
        shown = (s, round(height / width * s)) if width >= height else (round(width / height * s), s)
        if shown == (width, height):
            return f"live preview: the {width}x{height} image at its own size"
        how = "upscaled" if shown[0] > width else "downscaled"
        return f"live preview: the {width}x{height} image, shown {how} to {shown[0]}x{shown[1]}"


def comfy_interrupt() -> Optional[Callable[[], bool]]:
    mm = comfy_module("comfy.model_management")
    return None if mm is None else mm.processing_interrupted


def raise_comfy_interrupt(exc: BaseException):
    """Turn our GenerationInterrupted into ComfyUI's InterruptProcessingException (flag reset)."""
    mm = comfy_module("comfy.model_management")
    if mm is None:
        raise exc
    check = getattr(mm, "throw_exception_if_processing_interrupted", None)
    if check is not None:
        check()  # raises and clears the interrupt flag
    raise mm.InterruptProcessingException() from exc


# sampling

def pil_to_tensor(images) -> torch.Tensor:
    import numpy as np
    return torch.stack([torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0) for im in images])


def backend_config(values: dict):
    """(SamplerSettings, BackendConfig) from the sampler's values; ValueError names the bad value. Each value is
    checked once: the backend's parameters by `make_backend` (their `Param` checks, named as the node's inputs),
    the others by their widget (widgets.py: the same `Param` check), then the checks between parameters."""
    values = nest_dotted(values)
    err = validate([w for w in sampler_spec().inputs if w.name != "backend"], values)
    if err:
        raise ValueError(err)
    settings = sampler_settings(values)
    schema = _backends.SCHEMAS[settings.backend]
    conflict = setting_conflicts(schema, settings.params, values.get("same_image_as_ar", REPRODUCIBLE_DEFAULT))
    if conflict:
        raise ValueError(conflict)
    try:
        config = _backends.make_backend(settings.backend, **{
            p.name: resolve_drafter(settings.params[p.name], p.folder_of, p.name) if p.folder_of else
            settings.params[p.name] for p in schema.params if p.name in settings.params})
    except ValueError as e:
        raise ValueError(node_message(schema, str(e), flat=not isinstance(values["backend"], dict)))
    return settings, config


def node_message(schema, message: str, flat: bool) -> str:
    """`make_backend`'s message as the node's: a parameter named as the node's input (flat: "sjd_window")."""
    if flat and message.split(" ", 1)[0] in {p.name for p in schema.params}:
        message = f"{schema.name}_{message}"
    return comfy_message(message)


def setting_conflicts(schema, params: dict, same_image: bool) -> Optional[str]:
    """One message naming every input to change when a parameter's value needs others (`Param.implies`,
    followed through: relaxed needs candidate_mode topk, which needs tree_shape layers) or when a lossy
    setting (a parameter whose help starts "LOSSY") meets same_image_as_ar on; None when there is none."""
    value = {p.name: params.get(p.name, p.default) for p in schema.params}
    wanted = dict(value)
    for _ in schema.params:  # each pass follows one more link of a chain
        for p in schema.params:
            for v, forced in p.implies:
                if wanted[p.name] == v:
                    wanted.update(forced)
    changes = [f"{schema.name}_{k} {shown(wanted[k])} (now {shown(value[k])})" for k in value if wanted[k] != value[k]]
    causes = [p.name for p in schema.params for v, forced in p.implies
              if value[p.name] == v and any(value[k] != f for k, f in forced)]
    lossy = [p.name for p in schema.params if p.help.startswith("LOSSY") and value[p.name]]
    if lossy and same_image:
        changes.append("same_image_as_ar off (now on)")
        causes += lossy
    if not changes:
        return None
    causes = [f"{schema.name}_{k} {shown(value[k])}" for k in dict.fromkeys(causes)]
    return (f"{' and '.join(causes)} need{'s' if len(causes) == 1 else ''} {' and '.join(changes)}: set "
            f"{'them' if len(changes) > 1 else 'it'} on the node (the web extension does when you pick the value)")


SPEEDUP_HISTORY = 20  # compare_with_ar ratios kept per setting (this process): the verdict's samples
_speedups: dict = {}


def run_sampler(model, values: dict, progress: Optional[Callable] = None, interrupt: Optional[Callable] = None):
    """Generate from the sampler's widget values.

    Returns (IMAGE [B,H,W,C], tokens, stats JSON, heatmap IMAGE [B,H,W,3], summary text)."""
    model = resolve(model)
    settings, config = backend_config(values)
    batch = values.get("batch_size", 1)
    mode = values.get("preview", "image")
    preview = None
    if mode != "off" and hasattr(progress, "show"):  # only where something shows it (ComfyUI's progress bar)
        preview = PartialImage(model, progress.show, overlay=mode == "image + acceptance", **PREVIEW_THROTTLE)
    same_image = values.get("same_image_as_ar", REPRODUCIBLE_DEFAULT)
    common = dict(seed=values["seed"], sampling=settings.sampling, negative_prompt=values.get("negative_prompt", ""),
                  batch_size=batch, interrupt=interrupt, images=values.get("reference_images"))  # IMAGE [B,H,W,C]
    compare = bool(values.get("compare_with_ar")) and settings.backend != "ar"
    # compare_with_ar: one progress bar over both generations (the backend's run fills its first half, AR's
    # the second), so the bar does not sit at 100% while AR runs
    first_run = model not in _GENERATED  # one-time costs fall on this run
    with compile_stage.listening(getattr(progress, "stage", None)):
        res = generate(model, values["prompt"], backend=config, **common,
                       progress=(lambda d, t: progress(d, 2 * t)) if compare and progress else progress,
                       options=dict(reproducible=same_image, compile=values.get("compile", False), preview=preview))
    _GENERATED.add(model)
    geo = model.geometry
    grid = res.tokens.reshape(batch, geo.height, geo.width)
    rendered = res.images
    undecoded = None if rendered else getattr(model, "decoder_problem", None)  # why its decoder did not run
    if not rendered:  # the live preview's colours (GLM-Image without its DiT), at the image's size where it has one
        from PIL import Image
        size = (getattr(model, "width", None), getattr(model, "height", None))
        rendered = [im if None in size else im.resize(size, Image.NEAREST) for im in model.decode_preview(grid) or ()]
    if rendered:
        image = pil_to_tensor(rendered)
    else:  # the codes as grey levels
        codes = grid.float() / max(geo.vocab_size - 1, 1)
        image = codes[..., None].expand(-1, -1, -1, 3).contiguous()
    if preview is not None:  # the finished image replaces the last partial one now, before AR's run
        from PIL import Image
        progress.show([Image.fromarray((image[0].clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy())],
                      progress.last[1], progress.last[1])
    ar_stats = None
    if compare:
        # after the backend's run, so any first-run cost counts against the backend, never for it; plain
        # (eager) AR even when the backend is compiled: AR compiling its own shape would count for the backend
        ar_stats = generate(model, values["prompt"], backend="ar", **common, options=dict(reproducible=same_image),
                            progress=(lambda d, t: progress(t + d, 2 * t)) if progress else None).stats
    heat = torch.stack([heatmap(a, size=tuple(image.shape[1:3])) for a in res.stats.accepted_at_step])
    label = progress.label(image.shape[2], image.shape[1]) if preview is not None else None
    ratios = None
    one_time = first_run or bool(res.stats.compile and res.stats.compile.get("compiles"))
    if ar_stats is not None and not one_time:  # the same settings' earlier ratios in this process, and this one
        key = (id(model), settings.backend, repr(sorted(settings.params.items())), settings.sampling, batch,
               bool(values.get("compile")), values["prompt"], common["negative_prompt"], same_image,
               common["images"] is not None)
        ratios = _speedups.setdefault(key, [])
        ratios.append(ar_stats.latency_s / max(res.stats.latency_s, 1e-9))
        del ratios[:-SPEEDUP_HISTORY]
    text, stats = report(res.stats, ar_stats, settings, values, model, tuple(image.shape[1:3]), label,
                         ratios=ratios, first_run=first_run, undecoded=undecoded)
    tokens = {"tokens": grid, "model": model, "prompt": res.prompt}  # prompt: what a conditioned decoder reads
    return image, tokens, stats, heat, text


def run_sampler_in_comfy(handle, values: dict):
    """run_sampler with ComfyUI's progress bar, preview and interrupt; returns (outputs tuple, ui dict)."""
    model = resolve(handle)
    progress = ComfyProgress()
    try:
        image, tokens, stats, heat, text = run_sampler(model, values, progress=progress, interrupt=comfy_interrupt())
    except GenerationInterrupted as e:
        raise_comfy_interrupt(e)
    except torch.OutOfMemoryError as e:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the generation's caches are gone with its frames; the weights stay
        raise RuntimeError(out_of_memory_message(values, model)) from e
    finally:
        if progress.staged:  # cancelled or failed during a compile: its seconds stop counting
            progress.stage(None)
    if isinstance(handle, ModelHandle):
        tokens = {**tokens, "model": handle}  # ComfyUI caches outputs: keep the handle, not the model
    return (image, tokens, stats, heat), {"text": [text], "specar_stats": [stats]}


def decode_tokens(tokens) -> torch.Tensor:
    if not isinstance(tokens, dict) or "model" not in tokens or "tokens" not in tokens:
        raise ValueError("tokens must come from the tokens output of a SpecAR Sampler")
    images = resolve(tokens["model"]).decode_tokens(tokens["tokens"], prompt=tokens.get("prompt"))
    if not images:
        raise ValueError("this model has no image decoder")
    return pil_to_tensor(images)
