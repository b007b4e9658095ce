"""The static best-first tree shape of sampled adt_tree (samplers/drafters/static_tree.py)."""
import pytest
import torch

from specar.samplers.drafters.static_tree import best_first_shape

GUESS = dict(accept=0.88, accept_root=0.72, accept_sibling=0.25)


def expected_accepted(layers, accept: float, accept_root: float, accept_sibling: float) -> float:
    """Expected accepted drafts of a shape under the acceptance model of static_tree.py (the objective the
    greedy shape maximises)."""
    vals = torch.ones(1, dtype=torch.float64)
    total = 0.0
    for d, layer in enumerate(layers, start=1):
        s0 = accept_root if d == 1 else accept
        j = torch.arange(layer.children, dtype=torch.float64)
        s = torch.where(j == 0, torch.tensor(s0, dtype=torch.float64),
                        (1 - s0) * (1 - accept_sibling) ** (j - 1).clamp(min=0) * accept_sibling)
        v = vals[:, None] * s[None] * layer.alloc
        total += float(v.sum())
        if layer.order is None:
            break
        vals = v.flatten()[layer.order]
    return total


def _nodes(layers):
    """(depth, parent slot in the layer above or -1, rank) of every node, from the layer tables."""
    out, parents = [], [-1]
    for d, layer in enumerate(layers, start=1):
        assert layer.alloc.shape == (layer.expanded, layer.children) and layer.expanded == len(parents)
        for i in range(layer.expanded):
            ranks = layer.alloc[i].nonzero().flatten().tolist()
            assert ranks == list(range(len(ranks)))  # a node's children are its first draws, no gaps
            out += [(d, parents[i], j) for j in ranks]
        if layer.order is None:
            break
        # the expanded nodes of the next layer are slots this layer holds
        assert all(bool(layer.alloc.flatten()[s]) for s in layer.order.tolist())
        parents = layer.order.tolist()
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 31, 63, 95])
def test_shape_has_n_nodes_and_is_a_tree(n):
    layers = best_first_shape(n, **GUESS)
    assert len(_nodes(layers)) == n
    assert layers[-1].order is None


def test_best_first_beats_a_chain_and_equal_chains_under_its_model():
    layers = best_first_shape(63, **GUESS)
    chain = best_first_shape(63, accept=0.99, accept_root=0.99, accept_sibling=0.01)
    assert [layer.children for layer in chain] == [1] * 63  # near-certain first draws: one chain
    best, lin = expected_accepted(layers, **GUESS), expected_accepted(chain, **GUESS)
    assert best > lin + 0.5, (best, lin)
    # greedy optimality, checked against every shape with one more or one fewer root child
    for n in (8, 12):
        b = expected_accepted(best_first_shape(n, **GUESS), **GUESS)
        for accept_root in (0.05, 0.3, 0.5, 0.95):
            for sib in (0.05, 0.5, 0.95):
                other = best_first_shape(n, accept=0.88, accept_root=accept_root, accept_sibling=sib)
                assert expected_accepted(other, **GUESS) <= b + 1e-12


def test_low_first_draw_guess_buys_root_siblings():
    few = best_first_shape(63, **GUESS)[0].children
    many = best_first_shape(63, accept=0.88, accept_root=0.3, accept_sibling=0.25)[0].children
    assert many > few >= 1


@pytest.mark.parametrize("bad, match", [(dict(accept=1.0), "accept must be in"), (dict(accept_root=0.0), "accept_root"),
                                        (dict(accept_sibling=-1), "accept_sibling")])
def test_bad_guesses_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        best_first_shape(8, **{**GUESS, **bad})
    with pytest.raises(ValueError, match="at least one draft node, got 0"):
        best_first_shape(0, **GUESS)


def test_depth_cap():
    layers = best_first_shape(40, accept=0.99, accept_root=0.99, accept_sibling=0.01, max_depth=10)
    assert len(layers) == 10 and sum(int(layer.alloc.sum()) for layer in layers) == 40
    assert isinstance(layers[0].alloc, torch.Tensor)
