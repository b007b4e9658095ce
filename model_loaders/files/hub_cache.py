"""Checkpoints already in the user's Hugging Face cache, found by repo id without the network.

``huggingface-cli download deepseek-community/Janus-Pro-7B`` (or any transformers / diffusers
download) stores a repository as ``<cache>/models--deepseek-community--Janus-Pro-7B/snapshots/<rev>/``
(files there are links into ``blobs/``), with ``refs/main`` naming the revision last downloaded.
`find_cached("deepseek-community/Janus-Pro-7B")` returns that snapshot folder, which loads like any
model folder. The cache folder is the one huggingface_hub uses: ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
Nothing here imports huggingface_hub or touches the network: it only reads folders.
"""
from __future__ import annotations

import os
import re
from typing import Iterator, Optional, Tuple

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "huggingface", "hub")


def is_repo_id(name) -> bool:
    """'org/name' (a Hub repository id), not an existing path."""
    return isinstance(name, str) and bool(REPO_ID.match(name)) and not os.path.exists(name)


def _snapshot(repo_dir: str) -> Optional[str]:
    """The snapshot refs/main names, else the most recently written one; None when there is none."""
    snaps = os.path.join(repo_dir, "snapshots")
    ref = os.path.join(repo_dir, "refs", "main")
    if os.path.isfile(ref):
        try:
            with open(ref, encoding="utf-8") as f:
                rev = f.read().strip()
        except OSError:
            rev = ""
        if rev and os.path.isdir(os.path.join(snaps, rev)):
            return os.path.join(snaps, rev)
    if not os.path.isdir(snaps):
        return None
    revs = [os.path.join(snaps, r) for r in os.listdir(snaps) if os.path.isdir(os.path.join(snaps, r))]
    return max(revs, key=os.path.getmtime) if revs else None


def find_cached(repo_id: str) -> Optional[str]:
    """The cached snapshot folder of model repository `repo_id` ('org/name'), or None."""
    if not is_repo_id(repo_id):
        return None
    repo_dir = os.path.join(hub_cache_dir(), "models--" + repo_id.replace("/", "--"))
    return _snapshot(repo_dir) if os.path.isdir(repo_dir) else None


def cached_models() -> Iterator[Tuple[str, str]]:
    """(repo id, snapshot folder) of every model repository in the cache, sorted by id."""
    base = hub_cache_dir()
    if not os.path.isdir(base):
        return
    for d in sorted(os.listdir(base)):
        if not d.startswith("models--") or d.count("--") < 2:
            continue
        snap = _snapshot(os.path.join(base, d))
        if snap is not None:
            yield d[len("models--"):].replace("--", "/", 1), snap
