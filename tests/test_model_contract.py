"""The model contract: tree forwards equal sequential forwards, commits equal sequential runs."""
import pytest
import torch

from specar.model_loaders.contract import tree_ancestry, tree_depths
from specar.model_loaders.tiny import tiny_model

TOL = 1e-5


@pytest.fixture(scope="module")
def mdl():
    return tiny_model(8, (3, 4), seed=5, row_end=True)


def sequential_logits(mdl, prompt, prefix, cfg, one_by_one=True):
    """Logits after feeding `prefix` [B, n] token by token (or as one chain) from a fresh prefill."""
    B = prefix.shape[0]
    s = mdl.start(prompt, B, cfg, draft_capacity=prefix.shape[1] + 2)
    if prefix.shape[1] == 0:
        return s.first
    if one_by_one:
        for j in range(prefix.shape[1]):
            out = mdl.forward(s, prefix[:, j:j + 1], [-1])
            mdl.commit(s, None, torch.ones(B, dtype=torch.long))
        return out
    return mdl.forward(s, prefix, [-1] + list(range(prefix.shape[1] - 1)))


PARENTS = [-1, 0, 0, 1, 1, 2, 5, -1, 7]  # two roots, branching, depth up to 4


@pytest.mark.parametrize("cfg", [False, True])
def test_tree_forward_equals_branch_by_branch(mdl, cfg):
    prompt = mdl.encode_prompt("a tree", "neg")
    committed = torch.tensor([[3, 1, 0], [5, 5, 2]])  # two images, already 3 tokens in
    tree = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0, 1], [7, 6, 5, 4, 3, 2, 1, 0, 7]])
    s = mdl.start(prompt, 2, cfg, draft_capacity=len(PARENTS) + 1)
    for j in range(3):
        mdl.forward(s, committed[:, j:j + 1], [-1])
        mdl.commit(s, None, torch.ones(2, dtype=torch.long))
    out = mdl.forward(s, tree, PARENTS)
    anc = tree_ancestry(PARENTS)
    for i in range(len(PARENTS)):
        branch = anc[i].nonzero().flatten()  # ancestors in index order = root-to-node path
        ref = sequential_logits(mdl, prompt, torch.cat([committed, tree[:, branch]], 1), cfg)
        assert torch.allclose(out.cond[:, i], ref.cond[:, -1], atol=TOL)
        if cfg:
            assert torch.allclose(out.uncond[:, i], ref.uncond[:, -1], atol=TOL)


def test_chain_forward_equals_one_by_one(mdl):
    prompt = mdl.encode_prompt("chain")
    toks = torch.tensor([[1, 2, 3, 8, 4, 5]])  # 8 = row-end token (engine id vocab_size)
    a = sequential_logits(mdl, prompt, toks, cfg=True, one_by_one=False)
    b = sequential_logits(mdl, prompt, toks, cfg=True, one_by_one=True)
    assert torch.allclose(a.cond[:, -1], b.cond[:, -1], atol=TOL)
    assert torch.allclose(a.uncond[:, -1], b.uncond[:, -1], atol=TOL)


@pytest.mark.parametrize("cfg", [False, True])
def test_commit_of_a_tree_path_equals_sequential_run(mdl, cfg):
    prompt = mdl.encode_prompt("commit", "")
    tree = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0, 1], [7, 6, 5, 4, 3, 2, 1, 0, 7]])
    # row 0 accepts the path 0 -> 2 -> 5 -> 6, row 1 accepts 7 -> 8
    path = torch.tensor([[0, 2, 5, 6], [7, 8, 0, 0]])
    length = torch.tensor([4, 2])
    s = mdl.start(prompt, 2, cfg, draft_capacity=len(PARENTS) + 1)
    mdl.forward(s, tree, PARENTS)
    mdl.commit(s, path, length)
    assert s.committed.tolist() == [4, 2]
    nxt = torch.tensor([[3, 3], [2, 2]])
    out = mdl.forward(s, nxt, [-1, 0])
    for b in range(2):
        accepted = tree[b, path[b, :length[b]]]
        ref = sequential_logits(mdl, prompt, torch.cat([accepted, nxt[b]])[None], cfg)
        assert torch.allclose(out.cond[b, -1], ref.cond[0, -1], atol=TOL)
        if cfg:
            assert torch.allclose(out.uncond[b, -1], ref.uncond[0, -1], atol=TOL)


def test_uncommitted_drafts_leave_no_trace(mdl):
    # rollback is free: a forward whose nodes are not committed changes nothing
    prompt = mdl.encode_prompt("rollback")
    s = mdl.start(prompt, 1, False, draft_capacity=8)
    mdl.forward(s, torch.tensor([[5, 6, 7]]), [-1, 0, 1])
    mdl.commit(s, None, torch.tensor([1]))
    mdl.forward(s, torch.tensor([[1, 1, 1, 1]]), [-1, 0, 1, 2])  # rejected drafts
    out = mdl.forward(s, torch.tensor([[2]]), [-1])
    ref = sequential_logits(mdl, prompt, torch.tensor([[5, 2]]), cfg=False)
    assert torch.allclose(out.cond[:, -1], ref.cond[:, -1], atol=TOL)


def test_tree_helpers_reject_bad_parents():
    assert tree_depths([-1, 0, 1, -1, 3]) == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError, match="parents\\[1\\]"):
        tree_depths([-1, 1])


def test_geometry_forced_tokens():
    m = tiny_model(5, (2, 3), seed=0, row_end=True)
    g = m.geometry
    assert g.seq_len == 8 and g.row_stride == 4
    assert g.forced_tokens().tolist() == [-1, -1, -1, 5, -1, -1, -1, 5]
    assert g.image_positions().tolist() == [0, 1, 2, 4, 5, 6]


def test_tiny_llama_adapter_conformance():
    from support.conformance import check_conformance
    check_conformance(tiny_model(8, (3, 4), seed=5, row_end=True))


def test_demo_model_conformance():
    from support.conformance import check_conformance
    check_conformance(specar_load("demo"), tol=1e-4)


def specar_load(name):
    import specar
    return specar.load_model(name)


def test_conformance_catches_a_broken_commit():
    # planted bug: commit ignores the path (keeps the first nodes, as for a chain)
    from support.conformance import check_commit_path
    m = tiny_model(8, (3, 4), seed=5, row_end=True)
    real = m.commit
    m.commit = lambda s, path, length: real(s, None, length)
    with pytest.raises(AssertionError, match="after committing a tree path"):
        check_commit_path(m, False, 1e-5)
