"""One generation timed step by step, whole or cut after a fixed number of committed positions (the first rows of an
image, where a whole image does not fit a GPU lease), with its tokens so far; and the batch-invariant mode forced on
or off (gpu-check's images and quantized stages).

Timing: the engine reads the device once per step (its host read, which waits for the device on CUDA) and calls
`progress` there; the step times are the intervals between those calls, from the first step to the one that
committed the asked number of positions (the prefill and the image decode are left out; `prefill_s` is apart).
A cut run stops at the next host read (`interrupt`); its tokens are the sequence captured at the step that reached
the limit (`preview`, which never changes the tokens): every position before the limit is committed there."""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Optional

import torch


@contextlib.contextmanager
def batch_invariant_mode(on: Optional[bool]):
    """The target's forwards with the batch-invariant mode (model_loaders/precision/batch_invariant.py) forced on (True: also on
    CUDA, where the product leaves it off) or off (False: also on the CPU in half precision); None: the product's
    choice. Same-image runs only; restored after."""
    from ...model_loaders.precision import batch_invariant as bi
    if on is None:
        yield
        return
    product_plan = bi.target_forward_mode

    def forced(model, reproducible: bool, pin_width=None):
        if not reproducible or pin_width is not None:  # pinning asked for: the product's pinned case
            return product_plan(model, reproducible, pin_width)
        return (bi.BatchInvariant, bi.SameImage.BATCH_INVARIANT, "forced by gpu-check") if on else \
            (contextlib.nullcontext, bi.SameImage.NOT_GUARANTEED, "batch-invariant mode off (gpu-check)")

    bi.target_forward_mode = forced
    try:
        yield
    finally:
        bi.target_forward_mode = product_plan


def _quantile(xs: list, q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _image_codes(positions: torch.Tensor, geometry) -> torch.Tensor:
    """The image codes among a sequence's first positions, in raster order (row ends left out)."""
    if not geometry.row_end:
        return positions
    keep = torch.arange(positions.numel(), device=positions.device) % (geometry.width + 1) != geometry.width
    return positions[keep]


def timed_generation(model, prompt: str, backend, limit: Optional[int] = None, seed: int = 0, compile: bool = False,
                     invariant: Optional[bool] = None, pin_width: Optional[int] = None) -> tuple:
    """(image codes committed so far, in raster order (batch 1), record) of one generation with `backend` (a name
    or a BackendConfig), cut once `limit` positions (row ends included) are committed (None or >= the image: the
    whole image). `invariant`: the batch-invariant mode forced on / off (None: the product's choice); `pin_width`:
    every forward pinned at that many tokens (`RunOptions(pin_width=)`, instead of either).

    A two-grid model (`preceding_stage()`, GLM-Image): its preceding grid then its own, as `generate(model, text)`
    runs them (the same seeds: the same tokens), each stage timed as one generation; `limit` counts the positions of
    both, the codes are the first grid's then the second's, and the record's `grids` holds each stage's record (the
    totals add them; `prefill_s` includes the second grid's prompt and prefill)."""
    first = model.preceding_stage()
    if first is None:
        return _timed_stage(model, prompt, backend, limit, seed, compile, invariant, pin_width)
    from ...samplers.api import stage_seed
    n_first = first.geometry.seq_len
    total = n_first + model.geometry.seq_len
    limit = total if limit is None else min(limit, total)
    head, rec_first = _timed_stage(first, first.encode_prompt(prompt), backend, min(limit, n_first), seed, compile,
                                   invariant, pin_width)
    grids, parts = {"preview": rec_first}, [head]
    if limit > n_first:  # the second grid's prompt ends with the first grid's codes, as generate builds it
        tail, grids["target"] = _timed_stage(model, model.prompt_after(prompt, head), backend, limit - n_first,
                                             stage_seed(seed, 0), compile, invariant, pin_width)
        parts.append(tail)
    recs = list(grids.values())
    steps = [ms for r in recs for ms in r.pop("_steps")]
    record = {**recs[-1], "positions": limit, "whole_image": limit == total, "steps": len(steps),
              "step_ms_median": statistics.median(steps) if steps else None, "step_ms_p90": _quantile(steps, 0.9),
              "positions_per_step": round(sum(r["positions"] for r in recs) / len(steps), 3) if steps else None,
              "peak_memory_bytes": max((r["peak_memory_bytes"] for r in recs if r["peak_memory_bytes"] is not None),
                                       default=None)}
    for key in ("seconds", "prefill_s", "wall_s"):
        record[key] = round(sum(r[key] for r in recs), 4)
    for key in ("forwards", "decode_s"):
        if all(key in r for r in recs):
            record[key] = sum(r[key] or 0 for r in recs)
    record.pop("step_compression", None)  # per grid in `grids`
    record["grids"] = grids
    return torch.cat(parts), record


def _timed_stage(model, prompt, backend, limit, seed, compile, invariant, pin_width) -> tuple:
    """timed_generation of one grid (`prompt`: text, or the EncodedPrompt of a two-grid model's stage); the record
    keeps its step times under `_steps` only when the prompt is encoded (the caller adds the grids')."""
    from ...samplers.api import generate
    from ...samplers.engine import GenerationInterrupted
    seq_len = model.geometry.seq_len
    limit = seq_len if limit is None else min(limit, seq_len)
    marks, captured = [], {}

    class Capture:  # the sequence at the step that committed `limit` positions
        def due(self):
            return marks[-1][1] >= limit and not captured

        def __call__(self, seq, done, at_step):
            captured["seq"] = seq[:, :limit].clone()

    from ...model_loaders.precision import batch_invariant as bi
    dev = model.device
    with batch_invariant_mode(invariant):
        _, guarantee, reason = bi.target_forward_mode(model, True, pin_width)  # the same-image mode's (lossless backends' default)
        t0 = time.perf_counter()
        try:
            res = generate(model, prompt, backend=backend, seed=seed,
                           options=dict(compile=compile, preview=Capture(), pin_width=pin_width),
                           progress=lambda done, total: marks.append((time.perf_counter(), done)),
                           interrupt=lambda: bool(captured))
            n_codes = _image_codes(torch.arange(limit), model.geometry).numel()  # finished at or past the limit
            tokens, stats = res.tokens.reshape(-1)[:n_codes], res.stats
        except GenerationInterrupted:
            tokens, stats = _image_codes(captured["seq"].reshape(-1), model.geometry), None
    wall = time.perf_counter() - t0
    end = next(i for i, (_, done) in enumerate(marks) if done >= limit)
    steps = [1e3 * (marks[i][0] - marks[i - 1][0]) for i in range(1, end + 1)]
    record = {"positions": limit, "whole_image": limit == seq_len, "seconds": round(marks[end][0] - marks[0][0], 4),
              "prefill_s": round(marks[0][0] - t0, 4), "wall_s": round(wall, 4), "steps": len(steps),
              "step_ms_median": statistics.median(steps) if steps else None, "step_ms_p90": _quantile(steps, 0.9),
              "positions_per_step": round((limit - marks[0][1]) / len(steps), 3) if steps else None,
              "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
              "batch_invariant": guarantee == bi.SameImage.BATCH_INVARIANT,
              "same_image_guarantee": guarantee.value, "same_image_reason": reason, "pin_width": pin_width}
    if stats is not None:
        record.update(forwards=stats.nfe, step_compression=stats.step_compression, decode_s=stats.decode_s)
    if not isinstance(prompt, str):
        record["_steps"] = steps
    return tokens, record


def compare_tokens(tokens: torch.Tensor, reference: torch.Tensor) -> dict:
    """Tokens differing from the reference's over their common positions, and the first position that differs."""
    n = min(tokens.shape[-1], reference.shape[-1])
    diff = (tokens[..., :n].reshape(-1) != reference[..., :n].reshape(-1)).nonzero()
    return {"positions_compared": n, "tokens_differing": int(diff.numel()),
            "first_difference_at": None if diff.numel() == 0 else int(diff[0])}


__all__ = ["batch_invariant_mode", "compare_tokens", "timed_generation"]
