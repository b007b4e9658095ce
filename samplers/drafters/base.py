"""The drafter protocol: what every drafting method gives the engine's loop (samplers/engine.py: propose -> forward ->
verify -> commit -> observe) and is told back.

A drafter owns everything method-specific: how draft tokens are made (Jacobi iteration, Hawk's heads, an EAGLE layer),
the exact q each was drawn from, its own caches, and the shape of its trees. It proposes and observes only: its proposal
(`DraftTree`, `DraftChain`: samplers/proposal.py) carries what verification needs, and `samplers/verification/` (one
home for every acceptance rule) turns it and the target p into the `Verdict`. The engine owns the committed sequence,
the model session, the target distribution, statistics and the host read of each step. The hooks, the fixed shapes
(`node_budget` nodes every step, padded with invalid ones) and the proposal types: docs/ARCHITECTURE.md, "Drafters"."""
from __future__ import annotations

from typing import Any, Hashable, List, Optional, Union

import torch

from ...model_loaders.contract import ForwardOutput
from ..proposal import DraftTree, Verdict
from ..run_state import LoopState

# what `propose` receives of `host_hint`: an int (0-dim hint; 0 without one) or a list of ints (1-D)
HostHint = Union[int, List[int]]


class Drafter:
    """Base class of drafting methods: five hooks (`start`, `host_hint`, `plan`, `propose`, `observe`). Subclasses set
    `name`, `node_budget` and implement `start`, `propose` and `observe`. What changes on the device lives in the
    state object (`LoopState.draft`), not the drafter; the device phases read only the plan, `state` and their
    arguments, so the compiled step captures them as one graph per plan (docs/ARCHITECTURE.md, "Drafters")."""

    name: str = "drafter"
    node_budget: int = 1  # nodes per forward, pending token included
    slack: int = 3  # positions past the end of the image its trees may reach (node_budget + 2 is safe)
    lossless: bool = True

    def start(self, state: LoopState, first: ForwardOutput, p0: torch.Tensor) -> Any:
        """Called once after the prefill (p0 [B, V]: target of position 0, already sampled into seq[:, 0]); returns the
        drafter's state (`LoopState.draft`, None when it has none)."""
        return None

    def host_hint(self, state: LoopState) -> Optional[torch.Tensor]:
        """An integer tensor read back with the engine's one host read per step and passed to `propose` as `hint` (e.g.
        how many rows want a bigger tree), or None: 0-dim -> an int, 1-D -> a list of ints (`HostHint`)."""
        return None

    def plan(self, state: LoopState, hint: HostHint) -> Hashable:
        """The host half of a step: the choices that set its shapes (a chain or a tree, a window, a tree's depth and
        width) from the hint of the step's one host read; hashable. The device phases read only this (never the hint):
        the compiled step keeps one graph per plan, so a plan takes few values. Default: the hint (tuple when a list).
        """
        return tuple(hint) if isinstance(hint, list) else hint

    def propose(self, state: LoopState, plan: Hashable) -> DraftTree:
        raise NotImplementedError

    def observe(self, state: LoopState, plan: Hashable, tree: DraftTree, verdict: Verdict, p: torch.Tensor,
                out: ForwardOutput, previous_frontier: torch.Tensor) -> Any:
        """Told after the commit (``state.frontier`` already moved; ``state.active`` still the step's): the verdict,
        every node's target p [B, N, V], the forward's output (hidden states of both CFG branches included) and each
        row's frontier before the step. Returns the drafter's next state (`LoopState.draft`)."""
        return state.draft


class AdaptiveDrafter(Drafter):
    """A drafter whose plan weighs this machine's forward costs (auto; Hawk's and ADT-Tree's node_budget=0): the
    engine checks for it once, times its `cost_shapes` before the first step and reads its `report`; the compiled
    step runs its `one_off` steps eager."""

    def one_off(self, plan: Hashable) -> bool:
        """The step just planned is a one-off (an adaptive drafter's probe of a shape it does not run): the compiled
        step runs it eager instead of compiling a graph for its plan."""
        return False

    def cost_shapes(self) -> dict:
        """{choice: parents} of the forward shapes whose cost the engine should time for this drafter before the first
        step (an adaptive drafter such as auto); {} for the rest."""
        return {}

    def set_costs(self, seconds: dict) -> None:
        """The engine's timings of `cost_shapes` (seconds per forward, same keys)."""

    def report(self) -> Optional[dict]:
        """What an adaptive drafter chose and why (GenerationStats.backend_report), or None."""
        return None
