"""Shared setup of the test suite: `support` (tests/support/, the test support package) importable, and the node
tests' `comfy` fixture.

The tests import the product as `specar` and their support as `support`, nothing else of the checkout, so the
suite also runs against an installed package. The ComfyUI stand-ins go into sys.modules only inside the `comfy`
fixture (with monkeypatch: gone after each test)."""
import os
import sys

import pytest

collect_ignore = ["comfyui"]  # a real ComfyUI server's tests: `make test-comfyui` (tests/comfyui/conftest.py)

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from support import node_harness  # noqa: E402  (after the path)


@pytest.fixture
def comfy(monkeypatch, tmp_path):
    """ComfyUI stand-ins in sys.modules (undone after the test); "demo" is a tiny random model."""
    yield from node_harness.comfy_modules(monkeypatch, tmp_path)
