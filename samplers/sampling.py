"""The sampling settings (`SamplingParams`) and their one check; no torch, so the command line checks them before it
loads a model. samplers/target.py turns them into the target distribution."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional


@dataclass(frozen=True)
class SamplingParams:
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: int = 0  # 0 (or the vocabulary size): no top-k; the one spelling of "off"
    top_p: float = 1.0

    def validated(self, vocab_size: Optional[int] = None) -> "SamplingParams":
        """Every field checked by `check_sampling` (ValueError naming the bad value and the allowed range)."""
        for f in fields(self):
            check_sampling(f.name, getattr(self, f.name), vocab_size)
        return self

    @property
    def uses_cfg(self) -> bool:
        return float(self.cfg_scale) != 1.0


def check_sampling(name: str, value, vocab_size: Optional[int] = None):
    """`value` if allowed for the `SamplingParams` field `name`, else a ValueError naming it and what is allowed: the
    one check, for Python, the node's inputs and the command line (no model yet: `vocab_size` None, no top-k bound)."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if name == "top_k":  # a value bad whatever the model: the same message with or without `vocab_size`
        if not number or not isinstance(value, int) or value < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = no top-k), got {value!r}")
        if vocab_size is not None and value > vocab_size:
            raise ValueError(f"top_k must be an int in [0, {vocab_size}] (the image vocabulary; 0 = no top-k), got "
                             f"{value!r}")
    elif name == "top_p":
        if not number or not 0.0 < value <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1] (1.0 = no top-p), got {value!r}")
    elif not number or not math.isfinite(value) or value < 0:
        meaning = "1.0 = no guidance" if name == "cfg_scale" else "0 = greedy"
        raise ValueError(f"{name} must be a finite number >= 0 ({meaning}), got {value!r}")
    return value


@dataclass(frozen=True)
class SamplingField:
    """A sampling setting as a node input shows it (nodes/widgets.py, `Widget.source`): checked by `check_sampling`."""
    name: str

    def check(self, value):
        return check_sampling(self.name, value)
