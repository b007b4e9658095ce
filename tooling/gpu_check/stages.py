"""The stages of gpu-check, in the order they run (the runner runs each isolated, runner.py).

Each stage is a function of a `StageContext`: it reads the run's options from ``ctx.options``, writes what it
measured into ``ctx.result`` as it goes (``ctx.save()`` after each item, so a stage cut for time still leaves what
it finished), asks ``ctx.time_left()`` before starting an item it may not finish, and calls
``ctx.track_memory()`` after each piece of device work (the engine resets CUDA's peak counter at each
generation, so the stage's peak is the maximum of these readings)."""
from __future__ import annotations

from .backends import stage_backends
from .environment import stage_environment
from .exactness import stage_exactness
from .forward_7b import stage_forward_7b
from .images import stage_images
from .projection import stage_projection
from .quantized import stage_quantized

STAGES = {
    "environment": stage_environment,
    "exactness": stage_exactness,
    "images": stage_images,
    "quantized": stage_quantized,
    "backends": stage_backends,
    "forward_7b": stage_forward_7b,
    "projection": stage_projection,
}

__all__ = ["STAGES"]
