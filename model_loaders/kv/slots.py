"""Slot layout shared by the static-cache adapters (our Llama, transformers families).

Row r keeps its left-padded prompt in slots ``0..P-1`` and sequence position j at slot
``P + j``; draft node i of a forward goes to slot ``P + committed + i``. This module is the one
implementation of the prefill mask, of the draft-tree mask / positions (one tree shared by all
rows, or one tree per row) and of the slot moves that commit an accepted tree path (the cache that
holds the slots: kv/store.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, Union

import torch

from ..contract import tree_ancestry, tree_depths


@dataclass
class SlotState:
    """`Session.state` of the slot-cache adapters (internal rows R = batch, or 2 * batch with CFG)."""

    valid: torch.Tensor  # [R, S] bool: slot holds a real token (False: left padding of the prompt)
    pos0: torch.Tensor  # [R] position id of sequence position 0 (the prompt's length)
    P: int  # prompt slots (longest prompt; shorter ones are left-padded)
    S: int  # slots per row
    rows: int  # internal rows R
    cache: Any = None  # the adapter's KV cache


def prefill_layout(branches: list, batch: int, capacity_after_prompt: int, pad_id: int, device,
                   prompt_multiple: int = 1):
    """Left-padded prompt rows (``batch`` copies of each branch, branch by branch). The prompt
    slots P are rounded up to a multiple of ``prompt_multiple`` (a compiled step is specialised to
    the cache's shape: with a multiple of 64, prompts of 1-64 tokens share one compiled graph).

    Returns (tokens [R, P], positions [R, P], mask [R, P, S], slots [R, P], SlotState)."""
    n, P = len(branches), max(len(s) for s in branches)
    P = -(-P // prompt_multiple) * prompt_multiple
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
    return tokens, positions, mask, slots, SlotState(valid=valid, pos0=pos0, P=P, S=S, rows=R)


def draft_layout(P: int, S: int, valid: torch.Tensor, pos0: torch.Tensor, committed: torch.Tensor,
                 depth: torch.Tensor, anc: torch.Tensor):
    """Slots, positions and attention mask of a draft tree after each row's committed prefix.

    P, S, valid [R, S], pos0 [R]: the `SlotState`'s fields; committed [R] (CFG rows included);
    depth [T] and anc [T, T] for one tree shared by all rows, or depth [R, T] and anc [R, T, T]
    for one tree per row (``anc[.., i, j]``: node j is i or an
    ancestor of i). Returns (slots [R, T], positions [R, T], mask [R, T, S])."""
    T = depth.shape[-1]
    R = committed.shape[0]
    dev = committed.device
    depth = depth.expand(R, T)
    anc = anc.expand(R, T, T)
    base = P + committed  # [R] first free slot of each row
    slots = base[:, None] + torch.arange(T, device=dev)
    positions = pos0[:, None] + committed[:, None] + depth
    s = torch.arange(S, device=dev)
    prefix = (s[None] < base[:, None]) & valid  # [R, S]
    rel = s[None] - base[:, None]
    in_tree = (rel >= 0) & (rel < T)
    tree_part = anc.gather(2, rel.clamp(0, T - 1)[:, None, :].expand(R, T, S)) & in_tree[:, None, :]
    return slots, positions, prefix[:, None, :] | tree_part


def batched_tree_tensors(parents: torch.Tensor):
    """(depth [B, T], ancestry [B, T, T]) of one tree per row, on the parents' device, without a
    host read: the ancestry is the transitive closure of the parent relation, by ceil(log2 T)
    boolean matrix squarings. ``parents [B, T]``: -1 (child of the committed prefix) or an
    earlier node index (not checked here: the engine builds them)."""
    B, T = parents.shape
    dev = parents.device
    adj = torch.nn.functional.one_hot(parents.clamp(min=0), T).bool() & (parents >= 0)[..., None]
    anc = adj | torch.eye(T, dtype=torch.bool, device=dev)
    for _ in range(max(1, math.ceil(math.log2(max(T, 2))))):
        a = anc.float()
        anc = anc | (torch.bmm(a, a) > 0)
    return anc.sum(-1) - 1, anc


def tree_tensors(memo: dict, parents: Union[Sequence[int], torch.Tensor], device, n_tokens: int):
    """(depth, ancestry) of the draft tree of a forward of `n_tokens` tokens on `device`: ``[T]``
    and ``[T, T]`` for a shared tree (a list, memoised in `memo`: the Jacobi backends send the
    same one or two shapes every step), ``[B, T]`` and ``[B, T, T]`` for per-row trees (a tensor)."""
    if isinstance(parents, torch.Tensor) and parents.dim() == 2:
        if parents.shape[1] != n_tokens:
            raise ValueError(f"parents has {parents.shape[1]} entries per row for {n_tokens} tokens")
        return batched_tree_tensors(parents.to(device))
    if len(parents) != n_tokens:
        raise ValueError(f"parents has {len(parents)} entries for {n_tokens} tokens")
    key = (tuple(int(p) for p in parents), device)
    if key not in memo:
        memo[key] = (torch.tensor(tree_depths(key[0]), device=device), tree_ancestry(key[0]).to(device))
    return memo[key]


def cfg_rows(cfg: bool, *tensors):
    """Per-image tensors repeated for the unconditional rows (rows ``B..2B-1``) when CFG is on."""
    return tuple(torch.cat([t, t]) if cfg else t for t in tensors)


def path_moves(state: SlotState, committed: torch.Tensor, path: torch.Tensor):
    """Cache moves that make an accepted tree path consecutive: for every row, the slot of node
    ``path[r, k]`` (``src``) is copied to the slot of sequence position ``committed + k``
    (``dst``). committed [R], path [R, D] (CFG rows included). Returns (rows [R, 1], dst, src)."""
    base = state.P + committed
    dev = committed.device
    rows = torch.arange(state.rows, device=dev)[:, None]
    src = base[:, None] + path.clamp(min=0)
    dst = base[:, None] + torch.arange(path.shape[1], device=dev)
    return rows, dst, src


