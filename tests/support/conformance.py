"""The adapter-conformance suite: what every `ARImageModel` must satisfy for the sampling core
to be exact on it. Each family's tests call `check_conformance(model)` (tiny random weights
saved in the family's real format); a new family passes it before anything else.

Checked, with and without CFG:
- a tree forward (two roots, branching, depth 4) gives every node the logits of a sequential
  one-token-at-a-time run along its root-to-node path, with rows of one batch at different
  committed lengths;
- per-row trees (``parents`` as a [B, T] tensor) equal the same trees sent one row at a time;
- committing a non-chain path gathers it: the next forward equals a sequential run;
- uncommitted drafts leave no trace (rollback is free);
- hidden states: ``hidden`` / ``hidden_uncond`` have width ``hidden_size`` and
  ``image_logits(hidden)`` reproduces the returned logits.
Raises AssertionError naming the check and the largest difference.
"""
from __future__ import annotations

import torch

from specar.model_loaders.contract import ARImageModel, tree_ancestry

PARENTS = [-1, 0, 0, 1, 1, 2, 5, -1, 7]  # two roots, branching, depth up to 4
ROW_PARENTS = [[-1, 0, 1, 0, 3], [-1, -1, 1, 2, 0]]  # one tree per row


def _close(a, b, tol, what):
    diff = float((a.float() - b.float()).abs().max())
    assert diff <= tol, f"{what}: max |difference| {diff:.3g} > {tol:g}"


def _tokens(model: ARImageModel, shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(model.geometry.vocab_size, shape, generator=g)


def sequential(model, prompt, prefix, cfg):
    """Output after feeding `prefix` [1, n] one token per forward from a fresh prefill."""
    s = model.start(prompt, 1, cfg, draft_capacity=prefix.shape[1] + 2)
    out = s.first
    for j in range(prefix.shape[1]):
        out = model.forward(s, prefix[:, j:j + 1], [-1])
        model.commit(s, None, torch.ones(1, dtype=torch.long))
    return out


def _ragged_session(model, prompt, cfg, capacity):
    """A batch of 2 whose rows committed 3 and 1 tokens."""
    first = _tokens(model, (2, 3), 1)
    done = torch.tensor([3, 1])
    s = model.start(prompt, 2, cfg, draft_capacity=capacity)
    model.forward(s, first, [-1, 0, 1])
    model.commit(s, None, done)
    assert s.committed.tolist() == [3, 1], f"commit lengths: expected [3, 1], got {s.committed.tolist()}"
    return s, first, done


@torch.inference_mode()
def check_tree_forward(model, cfg, tol):
    prompt = model.encode_prompt("a red cat", "")
    s, first, done = _ragged_session(model, prompt, cfg, len(PARENTS) + 4)
    tree = _tokens(model, (2, len(PARENTS)), 2)
    out = model.forward(s, tree, PARENTS)
    anc = tree_ancestry(PARENTS)
    for b in range(2):
        for i in range(len(PARENTS)):
            path = anc[i].nonzero().flatten()
            ref = sequential(model, prompt, torch.cat([first[b, :done[b]], tree[b, path]])[None], cfg)
            _close(out.cond[b, i], ref.cond[0, -1], tol, f"tree node {i} of row {b} (cfg={cfg}) vs sequential")
            if cfg:
                _close(out.uncond[b, i], ref.uncond[0, -1], tol, f"tree node {i} of row {b}, unconditional")


@torch.inference_mode()
def check_per_row_trees(model, cfg, tol):
    prompt = model.encode_prompt("a red cat", "")
    n = len(ROW_PARENTS[0])
    tree = _tokens(model, (2, n), 3)
    s, _, _ = _ragged_session(model, prompt, cfg, n + 4)
    out = model.forward(s, tree, torch.tensor(ROW_PARENTS))
    for b in range(2):
        s1, _, _ = _ragged_session(model, prompt, cfg, n + 4)
        ref = model.forward(s1, tree[[b, b]], ROW_PARENTS[b])
        _close(out.cond[b], ref.cond[b], tol, f"per-row tree of row {b} (cfg={cfg}) vs the same tree shared")


@torch.inference_mode()
def check_commit_path(model, cfg, tol):
    prompt = model.encode_prompt("a red cat", "")
    tree = _tokens(model, (2, len(PARENTS)), 4)
    path, length = torch.tensor([[0, 2, 5, 6], [7, 8, 0, 0]]), torch.tensor([4, 2])
    s = model.start(prompt, 2, cfg, draft_capacity=len(PARENTS) + 4)
    model.forward(s, tree, PARENTS)
    model.commit(s, path, length)
    model.forward(s, _tokens(model, (2, 3), 5), [-1, 0, 1])  # drafts that are not committed
    nxt = _tokens(model, (2, 2), 6)
    out = model.forward(s, nxt, [-1, 0])
    for b in range(2):
        prefix = torch.cat([tree[b, path[b, :length[b]]], nxt[b]])[None]
        ref = sequential(model, prompt, prefix, cfg)
        _close(out.cond[b, -1], ref.cond[0, -1], tol, f"after committing a tree path, row {b} (cfg={cfg})")
        if cfg:
            _close(out.uncond[b, -1], ref.uncond[0, -1], tol, f"after committing a tree path, row {b}, unconditional")


@torch.inference_mode()
def check_hidden_states(model, cfg, tol):
    prompt = model.encode_prompt("a red cat", "")
    s = model.start(prompt, 2, cfg, draft_capacity=4)
    out = model.forward(s, _tokens(model, (2, 3), 7), [-1, 0, 1])
    for name, h, logits in (("hidden", out.hidden, out.cond), ("hidden_uncond", out.hidden_uncond, out.uncond)):
        if name == "hidden_uncond" and not cfg:
            assert h is None, "hidden_uncond must be None without CFG"
            continue
        assert h is not None and h.shape == (2, 3, model.hidden_size), \
            f"{name}: expected shape (2, 3, {model.hidden_size}), got {None if h is None else tuple(h.shape)}"
        _close(model.image_logits(h).float(), logits, tol, f"image_logits({name}) vs the returned logits")
    emb = model.embed_tokens(_tokens(model, (2, 3), 8).to(model.device))
    assert emb.shape == (2, 3, model.hidden_size), f"embed_tokens: shape {tuple(emb.shape)}"


def check_conformance(model: ARImageModel, tol: float = 1e-5) -> None:
    for cfg in (False, True):
        for check in (check_tree_forward, check_per_row_trees, check_commit_path, check_hidden_states):
            check(model, cfg, tol)
