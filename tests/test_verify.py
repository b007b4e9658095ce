"""Statistical tests of the pure verification primitives (no model involved).

Each test draws many independent trials in one batched call and compares the distribution of
the output token with the exact target by a chi-square test (fail below P_FAIL = 1e-6).
"""
import pytest
import torch

from specar.samplers.proposal import one_hot
from specar.samplers.randomness import gumbel_coupling, position_gumbel, sample_by_race
from specar.samplers.verification import rejection as rejection_mod
from specar.samplers.verification.rejection import mrs, residual, verify_candidates, verify_chain
from support.exactness import exponential_noise

P_FAIL = 1e-6
N = 200_000


def maximal_coupling(p_new: torch.Tensor, q_old: torch.Tensor, x_old: torch.Tensor, u: torch.Tensor,
                     noise: torch.Tensor) -> torch.Tensor:
    """A draft for p_new maximally coupled with x_old ~ q_old: P[same token] = 1 - TV(p_new, q_old).
    It is MRS itself (SCD, Thm. 2); the result is distributed as p_new, so p_new is its q."""
    return mrs(p_new, q_old, x_old, u, noise)[1]


def chi2_pvalue(tokens, p):
    V = p.numel()
    counts = torch.bincount(tokens.flatten(), minlength=V).double()
    e = p.double() * tokens.numel()
    keep = e > 0
    assert counts[~keep].sum() == 0, "a zero-probability token was produced"
    stat = ((counts[keep] - e[keep]) ** 2 / e[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def dists(V=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p[V - 1] = 0.0  # a token the target forbids (as top-k would)
    return p / p.sum(), q


def test_sample_by_race_matches_probs():
    p, _ = dists()
    g = torch.Generator().manual_seed(1)
    x = sample_by_race(p.expand(N, -1), exponential_noise((N, p.numel()), g, "cpu"))
    assert chi2_pvalue(x, p) > P_FAIL


def test_mrs_output_is_distributed_as_p():
    p, q = dists()
    g = torch.Generator().manual_seed(2)
    V = p.numel()
    x = sample_by_race(q.expand(N, -1), exponential_noise((N, V), g, "cpu"))
    acc, y = mrs(p.expand(N, -1), q.expand(N, -1), x, torch.rand(N, generator=g), exponential_noise((N, V), g, "cpu"))
    assert chi2_pvalue(y, p) > P_FAIL
    # acceptance rate is 1 - TV(p, q) (SCD Proposition 1), within 6 standard errors
    tv = 0.5 * (p - q).abs().sum()
    assert abs(acc.double().mean() - (1 - tv)) < 6 * (0.25 / N) ** 0.5


def test_mrs_with_equal_distributions_always_accepts():
    p, _ = dists()
    g = torch.Generator().manual_seed(3)
    x = sample_by_race(p.expand(1000, -1), exponential_noise((1000, 6), g, "cpu"))
    acc, y = mrs(p.expand(1000, -1), p.expand(1000, -1), x, torch.rand(1000, generator=g), exponential_noise((1000, 6), g, "cpu"))
    assert acc.all() and torch.equal(x, y)
    assert torch.allclose(residual(p, p), p)  # guarded: no division by a zero mass


def test_one_hot_candidate_accepts_with_p_of_the_token():
    p, _ = dists()
    g = torch.Generator().manual_seed(4)
    x = torch.full((N,), 2)
    acc, y = mrs(p.expand(N, -1), one_hot(x, 6), x, torch.rand(N, generator=g), exponential_noise((N, 6), g, "cpu"))
    assert abs(acc.double().mean() - p[2]) < 6 * (0.25 / N) ** 0.5
    assert chi2_pvalue(y, p) > P_FAIL


def _draw_without_replacement(q, K, n, g):
    # K distinct tokens from q, in order (successive draws from q with earlier ones removed)
    keys = exponential_noise((n, q.numel()), g, "cpu") / q  # smallest keys first = weighted order
    return keys.argsort(-1)[:, :K]


@pytest.mark.parametrize("K", [1, 2, 3, 5])
def test_candidates_without_replacement(K):
    p, q = dists(seed=K)
    g = torch.Generator().manual_seed(10 + K)
    V = p.numel()
    cands = _draw_without_replacement(q, K, N, g)
    idx, tok = verify_candidates(p.expand(N, -1), cands, torch.rand(N, K, generator=g),
                                 exponential_noise((N, V), g, "cpu"), q=q.expand(N, -1))
    assert chi2_pvalue(tok, p) > P_FAIL
    assert torch.equal(tok[idx >= 0], cands[idx >= 0].gather(1, idx[idx >= 0, None]).squeeze(1))


def test_candidates_without_replacement_planted_bug_is_caught(monkeypatch):
    # planted bug: forgetting to remove rejected siblings from q (errors up to 0.56 in the acceptance probabilities)
    p, q = dists(seed=3)
    g = torch.Generator().manual_seed(13)
    K, V = 3, p.numel()
    cands = _draw_without_replacement(q, K, N, g)
    u, noise = torch.rand(N, K, generator=g), exponential_noise((N, V), g, "cpu")
    _, tok = verify_candidates(p.expand(N, -1), cands, u, noise, qs=q.expand(N, K, V))  # q used as is
    assert chi2_pvalue(tok, p) < P_FAIL


@pytest.mark.parametrize("K", [2, 4])
def test_independent_candidates_from_different_q(K):
    p, _ = dists(seed=20)
    g = torch.Generator().manual_seed(21)
    V = p.numel()
    qs = torch.softmax(torch.randn(K, V, generator=g) * 2, -1)
    cands = torch.stack([sample_by_race(qs[k].expand(N, -1), exponential_noise((N, V), g, "cpu")) for k in range(K)], 1)
    _, tok = verify_candidates(p.expand(N, -1), cands, torch.rand(N, K, generator=g),
                               exponential_noise((N, V), g, "cpu"), qs=qs.expand(N, K, V))
    assert chi2_pvalue(tok, p) > P_FAIL


def test_one_hot_candidates_top_k_order():
    # deterministic candidates (top-k of a drafter): one-hot q each
    p, q = dists(seed=30)
    g = torch.Generator().manual_seed(31)
    V, K = p.numel(), 3
    cands = q.topk(K).indices.expand(N, K)
    _, tok = verify_candidates(p.expand(N, -1), cands, torch.rand(N, K, generator=g),
                               exponential_noise((N, V), g, "cpu"), qs=one_hot(cands, V))
    assert chi2_pvalue(tok, p) > P_FAIL


def test_maximal_coupling_marginal_and_collision():
    p_new, q_old = dists(seed=40)
    g = torch.Generator().manual_seed(41)
    V = p_new.numel()
    x_old = sample_by_race(q_old.expand(N, -1), exponential_noise((N, V), g, "cpu"))
    y = maximal_coupling(p_new.expand(N, -1), q_old.expand(N, -1), x_old, torch.rand(N, generator=g),
                         exponential_noise((N, V), g, "cpu"))
    assert chi2_pvalue(y, p_new) > P_FAIL
    same = (y == x_old).double().mean()
    assert abs(same - (1 - 0.5 * (p_new - q_old).abs().sum())) < 6 * (0.25 / N) ** 0.5


def test_gumbel_coupling_marginal_and_noise_is_fixed_per_position():
    p, q = dists(seed=50)
    V = p.numel()
    rows = torch.arange(N)
    G = position_gumbel(1234, rows, torch.full((N,), 7), V)
    assert torch.equal(G, position_gumbel(1234, rows, torch.full((N,), 7), V))  # same key/position: same noise
    assert not torch.equal(G, position_gumbel(1234, rows, torch.full((N,), 8), V))
    x = gumbel_coupling(p.expand(N, -1), G)
    assert chi2_pvalue(x, p) > P_FAIL
    y = gumbel_coupling(q.expand(N, -1), G)  # same noise, another distribution: strongly coupled
    assert (x == y).double().mean() > 1 - 0.5 * (p - q).abs().sum() - 0.2


def test_verify_chain_stops_at_first_rejection_and_respects_enabled():
    V = 4
    p = one_hot(torch.tensor([[1, 2, 3, 0]]), V)
    q = one_hot(torch.tensor([[1, 2, 0, 0]]), V)
    x = torch.tensor([[1, 2, 0, 0]])
    u = torch.zeros(1, 4)
    noise = torch.ones(1, 4, V)
    n, out = verify_chain(p, q, x, u, noise, enabled=torch.ones(1, 4, dtype=torch.bool))
    assert n.tolist() == [2] and out[0, 2] == 3  # correction from the residual
    n, _ = verify_chain(p, q, x, u, noise, enabled=torch.tensor([[True, False, False, False]]))
    assert n.tolist() == [1]


# -- the general tree rule (Hawk, ADT-Tree): verify_tree ------------------------------------------
TREE_PARENTS = [-1, 0, 0, 1, 2, 2]  # root (pending) -> {1, 2}; 1 -> {3}; 2 -> {4, 5}


def _tree_trial(n, seed, one_hot_nodes=()):
    """Two positions drafted as a tree; returns (pairs [n, 2], P1, P2) where the pair is the two
    tokens the verified tree (continued by plain sampling where it stopped) commits."""
    from specar.samplers.verification.rejection import verify_tree
    V = 4
    g = torch.Generator().manual_seed(seed)
    P1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    P2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # P2[x1] = distribution of token 2
    P2[:, 0] = 0.0  # a forbidden code, as top-k gives
    P2 = P2 / P2.sum(-1, keepdim=True)
    qs = torch.softmax(torch.randn(6, V, generator=g), -1)  # each node's own q
    tokens = torch.zeros(n, 6, dtype=torch.long)
    q = qs.expand(n, 6, V).clone()
    for i in range(1, 6):
        if i in one_hot_nodes:  # a deterministic candidate: always the argmax of its q, q one-hot
            tokens[:, i] = qs[i].argmax()
            q[:, i] = one_hot(tokens[:, i], V)
        else:
            tokens[:, i] = sample_by_race(q[:, i], exponential_noise((n, V), g, "cpu"))
    p = torch.empty(n, 6, V)
    p[:, 0] = P1
    p[:, 1:] = P2[tokens[:, 1:]]
    parents = torch.tensor(TREE_PARENTS).expand(n, 6)
    valid = torch.ones(n, 6, dtype=torch.bool)
    forced = torch.zeros(n, 6, dtype=torch.bool)
    u = torch.rand(n, 2, 2, generator=g)
    noise = exponential_noise((n, 3, V), g, "cpu")
    n_acc, path, pending = verify_tree(p, tokens, parents, q, valid, forced, u, noise, 2, 2)
    rows = torch.arange(n)
    t1 = torch.where(n_acc >= 1, tokens[rows, path[:, 1]], pending)
    t2_next = sample_by_race(P2[t1], exponential_noise((n, V), g, "cpu"))  # the next step, where the tree stopped
    t2 = torch.where(n_acc >= 2, tokens[rows, path[:, 2]], torch.where(n_acc == 1, pending, t2_next))
    return torch.stack([t1, t2], 1), P1, P2, n_acc


@pytest.mark.parametrize("one_hot_nodes", [(), (1, 4)])
def test_verify_tree_commits_the_exact_joint(one_hot_nodes):
    pairs, P1, P2, n_acc = _tree_trial(N, 11, one_hot_nodes)
    joint = (P1[:, None] * P2).flatten()
    assert chi2_pvalue(pairs[:, 0] * 4 + pairs[:, 1], joint) > P_FAIL
    assert (n_acc == 2).any() and (n_acc == 0).any()  # both depths and the residual path were exercised


def test_verify_tree_catches_a_missing_residual_update(monkeypatch):
    monkeypatch.setattr(rejection_mod, "residual", lambda p, q: p)  # planted bug: siblings see the old p
    pairs, P1, P2, _ = _tree_trial(N, 11)
    joint = (P1[:, None] * P2).flatten()
    counts = torch.bincount(pairs[:, 0] * 4 + pairs[:, 1], minlength=16).double()
    e = joint.double() * N
    keep = e > 0
    stat = ((counts[keep] - e[keep]) ** 2 / e[keep]).sum()
    p_value = float(torch.special.gammaincc(torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64), stat / 2))
    assert p_value < P_FAIL


def test_race_never_picks_a_zero_probability_code_even_with_zero_noise():
    # the float edge case: noise exactly 0 must not let a p = 0 code win
    p = torch.zeros(3, 8)
    p[:, 5] = 1.0
    p[2, 2] = 1e-45  # a denormal: p / E can underflow to 0, still beats every p = 0 code
    p[2, 5] = 0.0
    noise = torch.ones(3, 8)
    noise[:, 0] = 0.0
    assert sample_by_race(p, noise).tolist() == [5, 5, 2]
    g = torch.Generator().manual_seed(0)
    e = exponential_noise((1 << 20,), g, "cpu")
    assert bool((e > 0).all()) and bool(torch.isfinite(e).all())
