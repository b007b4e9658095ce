"""The shape of each backend's decode step, for projecting its cost onto another model and device (roofline.py's
`backend_plan`): tokens per image row of each verify forward, with the share of steps at each size (a backend whose
window changes has several), and the drafter network run before it. A step cost takes the backend's parameter
values by name (as a `bench --json` row records them), the codes per image row and the backend reports of the
row's generations; a value the row lacks is a KeyError (the projection names it). A backend without an entry in
STEP_COSTS has no projection."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DraftNetworkCost:
    """A drafter network run before each verify forward, in a projection's terms."""

    calls: int  # calls per step (EAGLE: one per tree layer; heads: one)
    tokens: int  # tokens per image row of each call
    layers: int = 0  # decoder layers of the target's width (EAGLE: 1; draft heads: 0)
    head_blocks: int = 0  # residual SiLU blocks of the target's width (Hawk / spatial heads)
    band: int = 0  # committed positions the drafter's layer attends to


@dataclass(frozen=True)
class StepCost:
    tokens: tuple  # ((tokens per image row, share of steps), ...)
    network: Optional[DraftNetworkCost] = None


def chain_tokens(window: int, row_codes: int) -> int:
    """Tokens per image row of a Jacobi-family forward on an image whose rows hold `row_codes` codes, each
    row followed by a forced row end: the pending token, `window` drafts and the row ends among them."""
    return 1 + window + window // row_codes


def jacobi_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """A chain of `window` drafts, plus the proactive branches ((K - 1) x D nodes) where the method has them
    (they follow a rejection only: counted on every step, an upper bound)."""
    tree = (p.get("tree_width", 1) - 1) * p.get("tree_depth", 0)
    return StepCost(((chain_tokens(p["window"], row_codes) + tree, 1.0),))


def auto_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """The windows auto chose, each with its share of the steps (`steps_per_window` of the backend reports); the
    share of steps that carried the proactive branches ((K - 1) x D more nodes) spread over the drafting windows."""
    counts: dict = {}
    for report in reports:
        for w, n in report.get("steps_per_window", {}).items():
            counts[int(w)] = counts.get(int(w), 0) + n
    if not counts:
        raise KeyError("steps_per_window")
    tree_steps = sum(report.get("tree_steps") or 0 for report in reports)
    total, drafting = sum(counts.values()), sum(n for w, n in counts.items() if w)
    tree_share = tree_steps / drafting if drafting else 0.0
    branch_nodes = (p.get("tree_width", 1) - 1) * p.get("tree_depth", 0)
    shapes = []
    for w, n in sorted(counts.items()):
        if not w:
            shapes.append((1, n / total))
            continue
        shapes.append((chain_tokens(w, row_codes), n / total * (1 - tree_share)))
        if tree_share and branch_nodes:
            shapes.append((chain_tokens(w, row_codes) + branch_nodes, n / total * tree_share))
    return StepCost(tuple((t, s) for t, s in shapes if s > 0))


def chosen_budget(p: dict, reports: list) -> int:
    """The node budget a row ran: its parameter, or (node_budget=0) the one chosen from measured costs."""
    return p["node_budget"] or reports[0]["tuned"]["node_budget"]


def hawk_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """A padded tree of node_budget nodes; the heads run once per step on the last accepted position."""
    heads = DraftNetworkCost(1, 1, head_blocks=p["horizontal_heads"] + p["vertical_depth"])
    return StepCost(((chosen_budget(p, reports), 1.0),), heads)


def adt_tree_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """A padded tree of node_budget nodes; the EAGLE layer runs once per tree layer (depth) on `width` nodes,
    attending to its default band of two image rows (EagleConfig.for_model)."""
    layer = DraftNetworkCost(p["depth"], p["width"], layers=1, band=2 * (row_codes + 1))
    return StepCost(((chosen_budget(p, reports), 1.0),), layer)


def spatial_step_cost(p: dict, row_codes: int, reports: list) -> StepCost:
    """SJD-PAC's chain and branches; the spatial heads (head_depths of them) run once per step."""
    chain = jacobi_step_cost(p, row_codes, reports)
    heads = DraftNetworkCost(1, 1, head_blocks=p["head_depths"]) if p.get("head_depths") else None
    return StepCost(chain.tokens, heads)


STEP_COSTS = {"ar": lambda p, row_codes, reports: StepCost(((1, 1.0),)), "sjd": jacobi_step_cost,
              "scd": jacobi_step_cost, "sjd_pac": jacobi_step_cost, "auto": auto_step_cost, "hawk": hawk_step_cost,
              "adt_tree": adt_tree_step_cost, "spatial": spatial_step_cost}

__all__ = ["DraftNetworkCost", "STEP_COSTS", "StepCost", "chain_tokens"]
