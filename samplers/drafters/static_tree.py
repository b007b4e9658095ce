"""A static draft-tree shape for sampled candidates, grown best-first (as Sequoia's trees).

A sampled tree is verified exactly only when whether a node exists never depends on its own value
or on its later siblings' (adt_tree/sampled.py); a shape fixed before anything is drawn satisfies that
trivially. Which fixed shape? The one that maximises the expected number of accepted drafts under
a simple acceptance model: the j-th draw (0-based, without replacement) of a node is the accepted
child with probability

    s_0 = a        (a_root for the root's first draw: a step starts right after a rejection,
                    at the hard positions, so the first draft is accepted less often)
    s_j = (1 - s_0) (1 - r)^(j - 1) r      for j >= 1 (later siblings, given the earlier ones failed)

and a node is reached-and-accepted with the product of s along its path. That value never grows
along a path nor along a node's siblings, so taking nodes greedily by value (a heap of each taken
node's first child and next sibling) gives the best tree of n nodes under the model, and every
prefix of the greedy order is a tree. The model's numbers only shape the tree; exactness does not
depend on them.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import List, Optional

import torch


@dataclass(frozen=True)
class Layer:
    """Layer d of the shape: `expanded` nodes of layer d - 1 (the root for d = 1) each draw up to
    `children` siblings; alloc[i, j] says whether expanded node i has a j-th child; `order`
    lists, as indices i * children + j of this layer's slots, the nodes expanded for layer d + 1
    (None for the last layer)."""
    expanded: int
    children: int
    alloc: torch.Tensor  # [expanded, children] bool
    order: Optional[torch.Tensor]  # [expanded of layer d + 1] long


def best_first_shape(n_nodes: int, accept: float, accept_root: float, accept_sibling: float,
                     max_depth: int = 64) -> List[Layer]:
    """The greedy best tree of `n_nodes` drafts (root excluded), as layers for batched drafting."""
    for name, v in (("accept", accept), ("accept_root", accept_root), ("accept_sibling", accept_sibling)):
        if not 0.0 < v < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {v!r}")
    if n_nodes < 1:
        raise ValueError(f"a tree needs at least one draft node, got {n_nodes}")

    def value(parent_value: float, depth: int, rank: int) -> float:
        s0 = accept_root if depth == 1 else accept
        return parent_value * (s0 if rank == 0 else (1 - s0) * (1 - accept_sibling) ** (rank - 1) * accept_sibling)

    # node = (depth, rank, parent id); heap of candidates (-value, tie-break counter, depth, rank, parent)
    nodes, n_children = [], [0]  # node 0 is the root
    values = [1.0]
    heap = [(-value(1.0, 1, 0), 0, 1, 0, 0)]
    tick = 1
    while heap and len(nodes) < n_nodes:
        nv, _, depth, rank, parent = heapq.heappop(heap)
        nodes.append((depth, rank, parent))
        values.append(-nv)
        n_children.append(0)
        n_children[parent] += 1
        me = len(nodes)  # this node's id
        heapq.heappush(heap, (-value(values[parent], depth, rank + 1), tick, depth, rank + 1, parent))
        if depth < max_depth:
            heapq.heappush(heap, (-value(-nv, depth + 1, 0), tick + 1, depth + 1, 0, me))
        tick += 2
    # layer d: the expanded nodes are layer d - 1's nodes with children, in that layer's slot order
    layers: List[Layer] = []
    expanded = [0]  # node ids expanded for layer 1: the root
    depth = 1
    while expanded:
        C = max(n_children[e] for e in expanded)
        alloc = torch.tensor([[j < n_children[e] for j in range(C)] for e in expanded], dtype=torch.bool)
        # ids of this layer's nodes by slot: children of expanded[i] in rank order
        slot_of = {}
        for nid, (d, rank, parent) in enumerate(nodes, start=1):
            if d == depth:
                slot_of[nid] = expanded.index(parent) * C + rank
        nxt = sorted((nid for nid in slot_of if n_children[nid] > 0), key=slot_of.get)
        order = torch.tensor([slot_of[nid] for nid in nxt], dtype=torch.long) if nxt else None
        layers.append(Layer(expanded=len(expanded), children=C, alloc=alloc, order=order))
        expanded, depth = nxt, depth + 1
    return layers
