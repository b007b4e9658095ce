"""The product modules' imports: no upward import between layers and no import cycle, between
modules and between folders.

Layers, top to bottom: tooling/ > nodes/, cli/ > training/, testing.py > samplers/ > model_loaders/. A module
imports only its own layer or those below it. Every import counts, also one inside a function (a lazy
import hides a cycle from Python, not from the reader). The folders' graph (one node per top folder,
testing.py its own) has no cycle either: two folders of one layer may not import each other, even
through modules that do not form a cycle."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = {"tooling": 4, "nodes": 3, "cli": 3, "training": 2, "testing": 2, "samplers": 1, "model_loaders": 0}
PRODUCT = tuple(LAYERS)  # folders, and testing.py (the tiny models of the bench and the tests)


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def product_modules() -> dict:
    """module name -> file, for every .py under the product folders."""
    out = {}
    for top in PRODUCT:
        if os.path.isfile(os.path.join(ROOT, top + ".py")):
            out[top] = os.path.join(ROOT, top + ".py")
            continue
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    out[module_name(os.path.join(folder, f))] = os.path.join(folder, f)
    return out


def imports_of(name: str, path: str, modules: dict) -> set:
    """The product modules `name` imports (relative imports resolved; `from pkg import mod` names mod)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = ".".join(filter(None, [base, node.module]))
            else:
                target = (node.module or "").removeprefix("specar.")
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("specar.") for a in node.names)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict:
    modules = product_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def folder_graph(graph: dict) -> dict:
    """The imports between top folders (testing.py as its own): folder -> the other folders it imports."""
    top = lambda m: m.split(".")[0]  # noqa: E731
    out = {f: set() for f in PRODUCT}
    for a, deps in graph.items():
        out[top(a)] |= {top(b) for b in deps if top(b) != top(a)}
    return out


def folder_cycles(graph: dict) -> list:
    return cycles(folder_graph(graph))


def upward_imports(graph: dict) -> list:
    layer = lambda m: LAYERS[m.split(".")[0]]  # noqa: E731
    return sorted((a, b) for a, deps in graph.items() for b in deps if layer(b) > layer(a))


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    graph = import_graph()
    assert "samplers.drafters.jacobi" in graph["samplers.backends"]
    assert "model_loaders.files.drafter_files" in graph["samplers.drafters.eagle.files"]
    assert "samplers.drafters.eagle.lantern_conversion" in graph["cli.convert_drafter"]
    assert "testing" in graph["cli.model_spec"] and "model_loaders.families.llama_adapter" in graph["testing"]
    assert "samplers.api" in graph["tooling.testing"] and "testing" in graph["tooling.testing"]
    assert "samplers.drafters.hawk.network" in graph["training.hawk"]
    folders = folder_graph(graph)
    assert folders["cli"] >= {"testing", "samplers", "model_loaders"} and "samplers" in folders["training"]


def test_no_upward_import():
    assert upward_imports(import_graph()) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_folder_cycle():
    """training/ owns training: samplers/ never imports it (the method-specific training modules live in
    training/ and import the methods' networks)."""
    assert folder_cycles(import_graph()) == []
    assert "training" not in folder_graph(import_graph())["samplers"]


@pytest.mark.parametrize("planted,check", [
    ({"model_loaders.registry": {"samplers.api"}}, upward_imports),  # model_loaders importing samplers
    ({"samplers.engine": {"nodes.core"}}, upward_imports),  # samplers importing the ComfyUI layer
    ({"model_loaders.files.drafter_files": {"model_loaders.registry"},
      "model_loaders.registry": {"model_loaders.files.drafter_files"}}, cycles),
    ({"testing": {"cli.args"}}, upward_imports),  # testing.py importing the commands
    # two folders of one layer importing each other through modules that form no cycle: the folders do
    ({"training.hawk": {"testing"}, "testing": {"training.loop"}}, folder_cycles),
])
def test_a_planted_edge_is_caught(planted, check):
    graph = import_graph()
    for a, deps in planted.items():
        graph[a] = graph[a] | deps
    assert check(graph), f"planted {planted} went unnoticed"


def test_the_planted_folder_cycle_is_not_a_module_cycle():
    """The folder check sees what the module checks cannot: the planted folder cycle above has no module
    cycle and no upward import."""
    graph = import_graph()
    graph["training.hawk"] = graph["training.hawk"] | {"testing"}
    graph["testing"] = graph["testing"] | {"training.loop"}
    assert cycles(graph) == [] and upward_imports(graph) == [] and folder_cycles(graph)
