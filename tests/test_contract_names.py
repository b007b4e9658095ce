"""The model contract (model_loaders/contract.py `ARImageModel`) names everything the engine and
`generate` use of a model: every attribute they read and every keyword they pass to `start`."""
from __future__ import annotations

import ast
import inspect
import os

from specar.model_loaders.contract import ARImageModel
from support import PACKAGE as ROOT

USERS = ("samplers/engine.py", "samplers/api.py", "samplers/stats.py", "samplers/compiled_step/step_graphs.py",
         "samplers/forward_costs.py")


def _is_model(node) -> bool:
    return (isinstance(node, ast.Name) and node.id == "model") or (
        isinstance(node, ast.Attribute) and node.attr == "model" and isinstance(node.value, ast.Name))


def uses(source: str) -> tuple:
    """(attributes read of `model` / `x.model`, keywords passed to its `start`)."""
    attrs, start_keywords = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_model(node.value):
            attrs.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "start" \
                and _is_model(node.func.value):
            start_keywords |= {k.arg for k in node.keywords}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and node.args and _is_model(node.args[0]) and isinstance(node.args[1], ast.Constant):
            attrs.add(node.args[1].value)
    return attrs, start_keywords


def contract_names() -> set:
    names = set(dir(ARImageModel))
    for cls in ARImageModel.__mro__:
        names |= set(getattr(cls, "__annotations__", {}))
    return names


def missing(source: str) -> tuple:
    attrs, keywords = uses(source)
    start = set(inspect.signature(ARImageModel.start).parameters)
    return sorted(attrs - contract_names()), sorted(keywords - start)


def test_engine_and_generate_use_only_the_contract():
    for path in USERS:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            source = f.read()
        attrs, keywords = uses(source)
        assert attrs, path  # the scan sees the uses
        assert missing(source) == ([], []), path
    assert "captured" in inspect.signature(ARImageModel.start).parameters
    assert "capturable" in contract_names()


def test_a_use_outside_the_contract_is_caught():
    planted = ("def f(self, model):\n    model.compile_graph()\n    self.model._forward_costs = {}\n"
               "    model.start(p, 1, True, draft_capacity=2, compiled=True)\n")
    assert missing(planted) == (["_forward_costs", "compile_graph"], ["compiled"])
