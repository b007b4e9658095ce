"""What the stages record besides their measurements: an error as one line of text, and torch._dynamo's
counters (graph breaks by reason, recompiles, cudagraph skips, unique graphs, ...) as plain dicts."""
from __future__ import annotations


def error_text(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:400] if text else ''}"


def counters() -> dict:
    """torch._dynamo.utils.counters as plain dicts ({} for a torch without dynamo)."""
    try:
        from torch._dynamo.utils import counters as dynamo_counters
    except Exception:  # noqa: BLE001 -- a torch without dynamo
        return {}
    return {str(k): {str(kk): vv for kk, vv in v.items()} for k, v in dynamo_counters.items() if v}


def counters_diff(before: dict, after: dict) -> dict:
    """The counts that changed from `before` to `after`, by group."""
    out = {}
    for group, items in after.items():
        diff = {k: v - before.get(group, {}).get(k, 0) for k, v in items.items()}
        diff = {k: v for k, v in diff.items() if v}
        if diff:
            out[group] = diff
    return out


__all__ = ["counters", "counters_diff", "error_text"]
