"""Shared setup of the test suite: the node tests' harness and its `comfy` fixture.

devtools/node_harness.py (not a test: the ComfyUI stand-ins and the helpers of tests/test_nodes_*.py) is
loaded by path as the module `specar_node_harness`, which the node tests import from. The stand-ins go into
sys.modules only inside the `comfy` fixture (with monkeypatch: gone after each test)."""
import importlib.util
import os
import sys

import pytest

collect_ignore = ["comfyui"]  # a real ComfyUI server's tests: `make test-comfyui` (tests/comfyui/conftest.py)

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "devtools", "node_harness.py")
_spec = importlib.util.spec_from_file_location("specar_node_harness", _path)
harness = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = harness
_spec.loader.exec_module(harness)


@pytest.fixture
def comfy(monkeypatch, tmp_path):
    """ComfyUI stand-ins in sys.modules (undone after the test); "demo" is a tiny random model."""
    yield from harness.comfy_modules(monkeypatch, tmp_path)
