"""Slot layout shared by the static-cache adapters (our Llama, transformers families).

Row r keeps its left-padded prompt in slots ``0..P-1`` and sequence position j at slot
``P + j``; draft node i of a forward goes to slot ``P + committed + i``. This module is the one
implementation of the prefill mask, of the draft-tree mask / positions and of the
slot moves that commit an accepted tree path.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .contract import tree_ancestry, tree_depths


def prefill_layout(branches: list, batch: int, capacity_after_prompt: int, pad_id: int, device):
    """Left-padded prompt rows (``batch`` copies of each branch, branch by branch).

    Returns (tokens [R, P], positions [R, P], mask [R, P, S], slots [R, P], state dict with
    valid [R, S], pos0 [R], P, S, rows)."""
    n, P = len(branches), max(len(s) for s in branches)
    S = P + capacity_after_prompt
    tokens = torch.full((n, P), pad_id, dtype=torch.long)
    valid = torch.zeros(n, S, dtype=torch.bool)
    pos0 = torch.zeros(n, dtype=torch.long)
    for r, s in enumerate(branches):  # left padding: every row's last prompt token sits at slot P-1
        tokens[r, P - len(s):] = torch.tensor(s, dtype=torch.long)
        valid[r, P - len(s):] = True
        pos0[r] = len(s)
    valid[:, P:] = True
    tokens, valid, pos0 = (t.repeat_interleave(batch, 0).to(device) for t in (tokens, valid, pos0))
    R = n * batch
    positions = (torch.arange(P, device=device)[None] - (P - pos0)[:, None]).clamp(min=0)
    ar = torch.arange(S, device=device)
    causal = ar[None, :] <= torch.arange(P, device=device)[:, None]  # [P, S]
    # a pad slot attends to itself only: no fully masked row (NaN in some attention kernels)
    own = ar[None, :] == torch.arange(P, device=device)[:, None]
    mask = (causal[None] & valid[:, None, :]) | own[None]
    slots = torch.arange(P, device=device).expand(R, P)
    return tokens, positions, mask, slots, dict(valid=valid, pos0=pos0, P=P, S=S, rows=R)


def draft_layout(state: dict, committed: torch.Tensor, depth: torch.Tensor, anc: torch.Tensor):
    """Slots, positions and attention mask of a draft tree after each row's committed prefix.

    committed [R] (CFG rows included), depth [T], anc [T, T] (node j is i or an ancestor of i).
    Returns (slots [R, T], positions [R, T], mask [R, T, S])."""
    T = depth.numel()
    dev = committed.device
    base = state["P"] + committed  # [R] first free slot of each row
    slots = base[:, None] + torch.arange(T, device=dev)
    positions = state["pos0"][:, None] + committed[:, None] + depth[None]
    s = torch.arange(state["S"], device=dev)
    prefix = (s[None] < base[:, None]) & state["valid"]  # [R, S]
    rel = s[None] - base[:, None]
    in_tree = (rel >= 0) & (rel < T)
    tree_part = anc[:, rel.clamp(0, T - 1)].permute(1, 0, 2) & in_tree[:, None, :]  # [R, T, S]
    return slots, positions, prefix[:, None, :] | tree_part


def tree_tensors(memo: dict, parents: Sequence[int], device, n_tokens: int):
    """(depth [T], ancestry [T, T]) of the draft tree of a forward of `n_tokens` tokens, on
    `device`, memoised in `memo`: the engine sends the same one or two tree shapes every step."""
    if len(parents) != n_tokens:
        raise ValueError(f"parents has {len(parents)} entries for {n_tokens} tokens")
    key = (tuple(int(p) for p in parents), device)
    if key not in memo:
        memo[key] = (torch.tensor(tree_depths(key[0]), device=device), tree_ancestry(key[0]).to(device))
    return memo[key]


def cfg_rows(cfg: bool, *tensors):
    """Per-image tensors repeated for the unconditional rows (rows ``B..2B-1``) when CFG is on."""
    return tuple(torch.cat([t, t]) if cfg else t for t in tensors)


def path_moves(state: dict, committed: torch.Tensor, path: torch.Tensor):
    """Cache moves that make an accepted tree path consecutive: for every row, the slot of node
    ``path[r, k]`` (``src``) is copied to the slot of sequence position ``committed + k``
    (``dst``). committed [R], path [R, D] (CFG rows included). Returns (rows [R, 1], dst, src)."""
    base = state["P"] + committed
    dev = committed.device
    rows = torch.arange(state["rows"], device=dev)[:, None]
    src = base[:, None] + path.clamp(min=0)
    dst = base[:, None] + torch.arange(path.shape[1], device=dev)
    return rows, dst, src
