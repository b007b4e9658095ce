"""Every lossless backend samples exactly the plain-AR distribution.

Each case draws EXACTNESS_SAMPLES (16000) images in one batched generation on a tiny model and runs a Pearson
chi-square test against `exact_distribution` (teacher-forced enumeration of every image). A case
fails when p < P_FAIL; with ~45 such tests, a correct sampler fails the suite with probability
below 45 * 1e-6 < 1e-4. The planted-bug tests show the same test catches broken verification.
"""
import pytest
import torch

import specar
from specar.samplers.drafters.jacobi import drafter as jacobi_mod
from specar.samplers.verification import rejection as rejection_mod
from specar.samplers.verification import branches as branches_mod
from support.exactness import EXACTNESS_MODELS, EXACTNESS_SETTINGS, exactness_model, tiny_model
from support.exactness import greedy_and_argmax, mark_long
from support.exactness import check_exact as sample_and_test
from support.calls import generate_kwargs

P_FAIL = 1e-6
MODELS = EXACTNESS_MODELS
SETTINGS = {k: EXACTNESS_SETTINGS[k] for k in ("plain", "cfg", "topk", "topp", "mixed")}
model = exactness_model


def _cases():
    cases = [("ar", {}, m, s) for m in MODELS for s in ("plain", "cfg")]
    cases += [("ar", {}, "v4-2x2", "topk"), ("ar", {}, "v3-2x3-rowend", "topp")]
    combos = list((m, s) for m in MODELS for s in SETTINGS)
    i = 0
    for window in (1, 2, 3, 16):
        for init in ("random", "repeat_left", "repeat_above", "sample_left", "sample_above"):
            m, s = combos[i % len(combos)]
            i += 1
            cases.append(("sjd", dict(window=window, init=init), m, s))
    for coupling in ("maximal", "gumbel"):
        for strength in (1.0, 0.5):
            for window, init in ((3, "random"), (16, "sample_above")):
                m, s = combos[i % len(combos)]
                i += 1
                cases.append(("scd", dict(window=window, init=init, coupling=coupling, coupling_strength=strength), m, s))
    # sjd_pac: (window L, tree_depth D, tree_width K), trees as wide as the vocabulary (K = V)
    for window, depth, width, extra in ((3, 1, 2, {}), (3, 2, 3, {}), (16, 3, 3, {}), (2, 2, 3, dict(init="sample_left")),
                                        (16, 3, 3, dict(continuation=False)), (4, 3, 2, dict(coupling="gumbel")),
                                        (16, 2, 3, dict(init="repeat_above")), (5, 3, 3, dict(init="sample_above"))):
        m, s = combos[i % len(combos)]
        i += 1
        cases.append(("sjd_pac", dict(window=window, tree_depth=depth, tree_width=width, **extra), m, s))
    cases.append(("sjd_pac", dict(window=16, tree_depth=3, tree_width=4), "v4-2x2", "cfg"))
    cases.append(("sjd_pac", dict(window=3, tree_depth=2, tree_width=4), "v4-2x2", "topk"))
    return cases


def _id(case):
    backend, params, m, s = case
    return "-".join([backend] + [f"{k}={v}" for k, v in params.items()] + [m, s])


def check_exact(backend, params, model_name, setting, **kw):
    return sample_and_test(backend, model_name, setting, **kw, **params)


# `make test` runs these cases of _cases() (every backend, init, coupling, a tree, row ends, CFG, top-k / top-p),
# `make test-long` all the others (pytest.mark.long)
QUICK_CASES = (0, 3, 11, 23, 24, 25, 31, 34, 37, 41, 43)


@pytest.mark.parametrize("case", mark_long(_cases(), QUICK_CASES), ids=_id)
def test_backend_is_exact(case):
    backend, params, m, s = case
    (p_value, stat, dof, tv), res = check_exact(backend, params, m, s)
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    if backend == "ar":
        assert res.stats.step_compression == pytest.approx(1.0)


def _stale_q_redraft(self, state, p, tpos, mrs_out, noise):
    # planted bug: record the distribution the OLD draft came from instead of the new p
    y, _ = _orig_redraft(self, state, p, tpos, mrs_out, noise)
    stale = state.draft.dist[state.rows[:, None], tpos % self.ring]
    return y, stale


_orig_redraft = jacobi_mod.JacobiDrafter._redraft


def test_planted_stale_q_is_caught(monkeypatch):
    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_redraft", _stale_q_redraft)
    (p_value, stat, dof, tv), _ = check_exact("sjd", dict(window=3, init="random"), "v3-2x2", "plain")
    assert p_value < P_FAIL, f"planted stale-q bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_planted_wrong_residual_is_caught(monkeypatch):
    # planted bug: after a rejection resample from p instead of norm(max(0, p - q))
    monkeypatch.setattr(rejection_mod, "residual", lambda p, q: p)
    (p_value, stat, dof, tv), _ = check_exact("sjd", dict(window=3, init="repeat_left"), "v3-2x2", "plain")
    assert p_value < P_FAIL, f"planted residual bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_planted_bug_in_coupling_is_caught(monkeypatch):
    # planted bug: Gumbel-coupled re-drafts recorded with the stale q (SCD)
    monkeypatch.setattr(jacobi_mod.JacobiDrafter, "_redraft", _stale_q_redraft)
    (p_value, stat, dof, tv), _ = check_exact("scd", dict(window=3, coupling="gumbel"), "v3-2x2", "plain")
    assert p_value < P_FAIL, f"planted bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


def test_planted_sibling_bug_is_caught(monkeypatch):
    # planted bug: verify tree siblings without zeroing the rejected ones in q
    real = branches_mod.verify_candidates

    def no_q_update(p, cands, u, noise, q=None, qs=None, valid=None):
        return real(p, cands, u, noise, qs=q[..., None, :].expand(*cands.shape, q.shape[-1]), valid=valid)

    monkeypatch.setattr(branches_mod, "verify_candidates", no_q_update)
    (p_value, stat, dof, tv), _ = check_exact("sjd_pac", dict(window=3, tree_depth=2, tree_width=3, init="random"),
                                              "v3-2x2", "plain")
    assert p_value < P_FAIL, f"planted sibling bug went unnoticed: p={p_value:.2e} TV={tv:.4f}"


GREEDY_BACKENDS = [("ar", {}), ("sjd", dict(window=3)), ("sjd", dict(window=16, init="sample_above")),
                   ("scd", dict(window=3, coupling="maximal")), ("scd", dict(window=16, coupling="gumbel", init="repeat_left")),
                   ("sjd_pac", dict(window=16, tree_depth=3, tree_width=3))]


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("backend,params", GREEDY_BACKENDS)
def test_greedy_gives_the_argmax_sequence(model_name, backend, params):
    mdl = model(model_name)
    tokens, argmax_image, prob = greedy_and_argmax(mdl, backend, 64, **params)
    assert prob == pytest.approx(1.0)
    assert (tokens == argmax_image).all()


def test_same_seed_same_tokens_and_seeds_differ():
    mdl = tiny_model(16, (4, 4), seed=3, row_end=True)
    for backend, params in (("ar", {}), ("sjd", dict(window=5, init="sample_left")), ("scd", dict(coupling="gumbel"))):
        a = specar.generate(mdl, "a cat", **generate_kwargs(backend=backend, **params), seed=11).tokens
        b = specar.generate(mdl, "a cat", **generate_kwargs(backend=backend, **params), seed=11).tokens
        c = specar.generate(mdl, "a cat", **generate_kwargs(backend=backend, **params), seed=12).tokens
        assert torch.equal(a, b)
        assert not torch.equal(a, c)
