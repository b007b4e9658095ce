"""The compiled step changes nothing of the process it runs in (ComfyUI's): inductor's cache folder and
dynamo's recompile limit are set only around the calls that may compile, and restored after."""
from __future__ import annotations

import os

import torch

from specar.samplers.compiled_step import shape_compiled as compiled
from specar.samplers.compiled_step.shape_compiled import RECOMPILE_LIMIT, CompileStats, ShapeCompiled, compile_scope

ENV = "TORCHINDUCTOR_CACHE_DIR"


def _limit():
    return torch._dynamo.config.recompile_limit


def test_the_scope_sets_cache_folder_and_limit_only_inside(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    before = _limit()
    folder = compiled.persistent_cache_dir()
    assert folder == os.path.join(str(tmp_path), "specar", "torchinductor") and ENV not in os.environ
    with compile_scope(folder):
        assert os.environ[ENV] == folder and _limit() == max(before, RECOMPILE_LIMIT)
    assert ENV not in os.environ and _limit() == before
    # the user's own folder is kept and used
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert compiled.persistent_cache_dir() == str(tmp_path / "mine")
    with compile_scope(compiled.persistent_cache_dir()):
        assert os.environ[ENV] == str(tmp_path / "mine")
    assert os.environ[ENV] == str(tmp_path / "mine")


def test_shape_compiled_scopes_only_the_calls_that_compile(monkeypatch, tmp_path):
    """A planted torch.compile records the settings each call of the compiled function ran under."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seen = []

    def fake_compile(fn, **kwargs):
        def run(*args):
            seen.append((os.environ.get(ENV), _limit()))
            return fn(*args)
        return run

    monkeypatch.setattr(compiled.torch, "compile", fake_compile)
    before = _limit()
    step = ShapeCompiled(lambda x: x * 2, torch.device("cpu"), "test step", CompileStats())
    assert ENV not in os.environ and _limit() == before  # constructing it sets nothing
    x = torch.ones(2)
    for key in ("a", "a", "b"):
        assert torch.equal(step(key, x), x * 2)
    folder = os.path.join(str(tmp_path), "specar", "torchinductor")
    limit = max(before, RECOMPILE_LIMIT)
    assert seen == [(folder, limit), (None, before), (folder, limit)]  # new shapes only
    assert ENV not in os.environ and _limit() == before
