"""ADT-Tree's band cache (adt_tree/drafter.py `_band_pass`): the EAGLE layer's keys / values of
committed positions are kept by position and only the newest `fresh` positions of the band run
through the layer each step.

- the root feature it gives equals a full recomputation of the band (the layer's output at the
  pending position attending to the whole band, every band position recomputed), step after step;
  a planted cache that recomputes too few positions (stale keys / values) is caught by that check;
- generations whose band is partly read back are exact (chi-square, as tests/test_adt_tree.py).
"""
import pytest
import torch

import specar
from specar.samplers.backends import make_backend
from specar.samplers.drafters.adt_tree.drafter import ADTTreeDrafter
from specar.samplers.target import SamplingParams
from support.exactness import check_exact, exactness_model, tiny_model, use_drafter
from support.calls import generate_kwargs

P_FAIL = 1e-6
# 6 x 8 codes with row ends: band of 2 rows (18 positions), trees at most 5 deep (fresh = 6)
BAND_MODEL = dict(vocab_size=8, grid=(6, 8), seed=5, row_end=True)


def full_band_root(drafter: ADTTreeDrafter, state) -> torch.Tensor:
    """The root feature [R, 1, D] with every band position recomputed through the layer."""
    B, dev, W = state.ctx.batch, state.ctx.device, drafter.attn_band
    R = 2 * B if drafter.uses_cfg else B
    fR = state.frontier.repeat(2) if drafter.uses_cfg else state.frontier
    wpos = fR[:, None] - W + 1 + torch.arange(W, device=dev)
    wvalid, wposc = wpos >= 0, wpos.clamp(min=0)
    ar = torch.arange(W, device=dev)
    mask = (ar[:, None] >= ar[None, :]) & wvalid[:, None, :]
    mask[:, ar, ar] = True
    feats = state.draft.hidden.states[torch.arange(R, device=dev)[:, None], wposc]
    toks = state.seq[state.rows[:, None], wposc[:B]]
    kv = drafter.net.new_cache(R, W, dev, torch.float32)
    return drafter.net(feats, drafter._embed(toks), wposc, mask, kv, ar.expand(R, W))[:, -1:]


class CheckedBand(ADTTreeDrafter):
    """Records, every step, the largest difference between the cached root feature and the full
    recomputation, and how many band positions were read back from the cache."""
    worst = []

    def _band_pass(self, state, S):
        band, g = super()._band_pass(state, S)
        type(self).worst.append((float((g - full_band_root(self, state)).abs().max()),
                                  int(((state.frontier - self.fresh) >= 0).sum())))
        return band, g


class StaleBand(CheckedBand):
    """Planted bug: only the pending position is recomputed; positions committed in the previous
    step (after the first) are never written to the cache, so their keys / values stay stale."""

    def start(self, state, first, p0):
        self.fresh = 1
        return super().start(state, first, p0)


# the default setting's recomputation check (the slowest) waits for `make test-long` (pytest.mark.long)
@pytest.mark.parametrize("params", [pytest.param(dict(), marks=pytest.mark.long), dict(candidate_mode="topk", node_budget=6),
                                    dict(candidate_mode="sampled", node_budget=6, children=1)])
def test_cached_band_equals_full_recomputation(monkeypatch, params):
    CheckedBand.worst = []
    use_drafter(monkeypatch, "adt_tree", CheckedBand)
    res = specar.generate(tiny_model(**BAND_MODEL), "hi",
                          **generate_kwargs(backend="adt_tree", cfg_scale=2.0, **params), seed=3, batch_size=6)
    diffs, read_back = zip(*CheckedBand.worst)
    print(f"\n{params}: {len(diffs)} steps, max |cached - recomputed| = {max(diffs):.2e}, "
          f"steps reading the cache: {sum(1 for r in read_back if r)}")
    assert sum(1 for r in read_back if r) >= 5  # the cache was read in many steps
    assert max(diffs) < 1e-4
    assert res.stats.step_compression > 1.0


def test_planted_stale_band_is_caught(monkeypatch):
    StaleBand.worst = []
    use_drafter(monkeypatch, "adt_tree", StaleBand)
    specar.generate(tiny_model(**BAND_MODEL), "hi", backend=specar.make_backend("adt_tree", node_budget=6), seed=3,
                    batch_size=6, sampling=dict(cfg_scale=2.0))
    worst = max(d for d, _ in StaleBand.worst)
    print(f"\nplanted stale band: max |cached - recomputed| = {worst:.2e}")
    assert worst > 1e-2, "a stale band cache went unnoticed"


def test_band_cache_is_read_in_the_exactness_cases():
    # node_budget=3: trees at most 2 deep, fresh = 3 of the band's 8 positions (the rest read back)
    model = exactness_model("v3-2x3-rowend")
    sampling = SamplingParams().validated(model.geometry.vocab_size)
    drafter = make_backend("adt_tree", node_budget=3).make_drafter(model, sampling)
    assert drafter.fresh < drafter.attn_band


@pytest.mark.parametrize("params", [dict(candidate_mode="topk"), dict(candidate_mode="sampled"),
                                    dict(candidate_mode="sampled", adaptive=False, depth=2, children=1)])
@pytest.mark.parametrize("setting", ["plain", pytest.param("cfg", marks=pytest.mark.long)])  # cfg: make test-long
def test_partly_cached_band_is_exact(params, setting):
    (p_value, stat, dof, tv), res = check_exact("adt_tree", "v3-2x3-rowend", setting, node_budget=3, **params)
    print(f"\nband cache {setting} {params}: p={p_value:.3g} chi2={stat:.1f} dof={dof} TV={tv:.4f}")
    assert p_value > P_FAIL, f"chi2={stat:.1f} dof={dof} p={p_value:.2e} TV={tv:.4f}"
    assert not res.stats.lossy
