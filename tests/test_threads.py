"""generate(threads=...): the demo's thread choice from Python, for one call only; torch's global setting (which a
ComfyUI user's other nodes share) is restored after the call, also after an error, and untouched by default."""
import pytest
import torch

import specar
from specar.model_loaders.tiny import tiny_model
from support.calls import generate_kwargs


def _threads_inside(model, **kw) -> set:
    seen = set()
    specar.generate(model, "hi", **generate_kwargs(backend="sjd", **kw), seed=0,
                    progress=lambda done, total: seen.add(torch.get_num_threads()))
    return seen


def test_threads_hold_for_the_call_and_are_restored(monkeypatch):
    model = tiny_model(8, (2, 2), seed=0)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert _threads_inside(model, threads=1) == {1} and torch.get_num_threads() == 3
        assert _threads_inside(model) == {3}  # None: torch's own setting, untouched
        monkeypatch.setattr("specar.samplers.threads.load_average", lambda: [0.0, 0.0, 0.0])
        monkeypatch.setattr("specar.samplers.threads.cores", lambda: 2)
        assert _threads_inside(model, threads="auto") == {2} and torch.get_num_threads() == 3  # min(3, 2 free)
        monkeypatch.setattr("specar.samplers.threads.load_average", lambda: [5.0, 5.0, 5.0])
        assert _threads_inside(model, threads="auto") == {1}  # a busy machine: one thread
        with pytest.raises(RuntimeError, match="stop"):  # restored after an error inside the call
            specar.generate(model, "hi", backend="sjd", options=dict(threads=2),
                            progress=lambda done, total: (_ for _ in ()).throw(RuntimeError("stop")))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -1, "all", 1.5, True])
def test_bad_threads_name_the_parameter(bad):
    with pytest.raises(ValueError, match="threads must be None"):
        specar.generate(tiny_model(8, (2, 2), seed=0), "hi", backend="ar", options=dict(threads=bad))
