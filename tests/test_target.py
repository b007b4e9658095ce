"""The target distribution (samplers/target.py) against references computed another way."""
import numpy as np
import pytest
import torch

from specar.samplers.target import SamplingParams, kth_largest, target_probs


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("k", [1, 7, 256, 1023])
def test_kth_largest_matches_sorting(k):
    x = torch.randn(3, 5, 1024, generator=torch.Generator().manual_seed(k))
    ref = x.sort(dim=-1, descending=True).values[..., k - 1 : k]
    assert torch.equal(kth_largest(x, k), ref)
    assert torch.equal(x.topk(k, dim=-1).values[..., -1:], ref)  # the CUDA path's kernel agrees


def test_top_k_keeps_ties_at_the_threshold():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    p = target_probs(logits, None, SamplingParams(top_k=2))
    # the 2nd largest value is 2.0, held by two tokens: both stay (as masking `< kth` does)
    ref = np.zeros(5)
    ref[[0, 2, 3]] = _softmax(np.array([3.0, 2.0, 2.0]))
    assert np.allclose(p.numpy(), ref, atol=1e-6)


def test_cfg_temperature_top_k_top_p_order():
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(64, generator=g), torch.randn(64, generator=g)
    params = SamplingParams(cfg_scale=3.0, temperature=0.7, top_k=20, top_p=0.8)
    p = target_probs(cond, uncond, params).numpy()
    # reference in numpy: guidance on logits, temperature, keep the 20 largest, then the
    # smallest most-likely set reaching mass 0.8 (the crossing token kept), renormalise
    z = (uncond + 3.0 * (cond - uncond)).numpy() / 0.7
    keep = np.argsort(-z)[:20]
    q = np.zeros(64)
    q[keep] = _softmax(z[keep])
    order = np.argsort(-q)
    before = np.cumsum(q[order]) - q[order]
    q[order[before >= 0.8]] = 0.0
    q /= q.sum()
    assert np.allclose(p, q, atol=1e-6)


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0]])
    p = target_probs(logits, None, SamplingParams(temperature=0))
    assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]  # lowest index on ties
