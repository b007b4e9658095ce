"""Checkpoints already in the user's Hugging Face cache are found by repo id, without the network
(model_loaders/files/hub_cache.py), by `load_model` and by the loader node beside ComfyUI/models/specar."""
import os
import shutil

import pytest

import specar
from specar.model_loaders.files import hub_cache
from specar.model_loaders.registry import detect_family, resolve_checkpoint

REPO = "deepseek-community/Janus-Pro-7B"


def fake_snapshot(cache, repo_id, rev="abc123", ref=True, model_type="janus"):
    """The hub cache layout: models--org--name/snapshots/<rev>/ (+ refs/main), config.json in it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"model_type": "%s"}' % model_type)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
    return str(snap)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    c = tmp_path / "hub"
    c.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(c))
    return c


def test_cache_folder_follows_huggingface_hub(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache.hub_cache_dir() == os.path.join(str(tmp_path), ".cache", "huggingface", "hub")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert hub_cache.hub_cache_dir() == "/x/huggingface/hub"
    monkeypatch.setenv("HF_HOME", "/h")
    assert hub_cache.hub_cache_dir() == "/h/hub"
    monkeypatch.setenv("HF_HUB_CACHE", "/c")
    assert hub_cache.hub_cache_dir() == "/c"


def test_repo_id_resolves_to_the_refs_main_snapshot(cache):
    old = fake_snapshot(cache, REPO, rev="old", ref=False)
    new = fake_snapshot(cache, REPO, rev="new")
    os.utime(old, (4e9, 4e9))  # the newest folder is not the one refs/main names
    assert hub_cache.find_cached(REPO) == new
    assert resolve_checkpoint(REPO) == new and detect_family(resolve_checkpoint(REPO)) == "janus"
    shutil.rmtree(cache / "models--deepseek-community--Janus-Pro-7B" / "refs")
    assert hub_cache.find_cached(REPO) == old  # no refs/main: the most recent snapshot
    assert hub_cache.find_cached("not-a-repo-id") is None and hub_cache.find_cached("org/missing") is None


def test_missing_repo_is_a_clear_error_naming_the_cache(cache):
    with pytest.raises(ValueError, match=r"'org/missing' is not a folder, and the Hugging Face cache .*hub.* has no "
                                         r"snapshot .*huggingface-cli download org/missing"):
        specar.load_model("org/missing")


def test_loader_node_lists_and_loads_cached_models(cache, tmp_path, monkeypatch):
    from specar.nodes import models
    janus = fake_snapshot(cache, REPO)
    fake_snapshot(cache, "someone/not-a-model", model_type="bert")
    monkeypatch.setattr(models, "_model_dirs", lambda folder=models.FOLDER: [])
    choices = models.model_choices()
    assert REPO in choices and "someone/not-a-model" not in choices
    assert models.resolve_model(REPO) == janus
    with pytest.raises(ValueError, match="model 'org/none' not found"):
        models.resolve_model("org/none")


def test_a_folder_in_models_specar_comes_first(cache, tmp_path, monkeypatch):
    from specar.nodes import models
    fake_snapshot(cache, REPO)
    base = tmp_path / "models" / "specar"
    local = base / "Janus-Pro-7B"
    local.mkdir(parents=True)
    (local / "config.json").write_text('{"model_type": "janus"}')
    monkeypatch.setattr(models, "_model_dirs", lambda folder=models.FOLDER: [str(base)])
    assert models.model_choices()[-2:] == ["Janus-Pro-7B", REPO]
    assert models.resolve_model("Janus-Pro-7B") == str(local)
