"""The product modules' imports: no upward import between layers and no import cycle, between
modules and between folders; no import of the maintainers' tooling or of the tests from the product (the tests'
own imports: tests/test_suite_rules.py).

The product is tests/support/product.py's (every tracked .py outside tests/ and tooling/). Layers, top to bottom:
the package's entry points (__init__.py, __main__.py) > nodes/, cli/ > training/ > samplers/ > model_loaders/. A
module imports only its own layer or those below it. Every import counts, also one inside a function (a lazy
import hides a cycle from Python, not from the reader) and one by name (`importlib.import_module` or
`__import__` of a string, or of each name of a module-level tuple of strings). The folders' graph (one node
per top folder) has no cycle either: two folders of one layer may not import each
other, even through modules that do not form a cycle. Inside samplers/ the parts (its modules and
folders) have layers of their own, SAMPLER_LAYERS: a part imports only parts of a lower layer."""
import ast
import os

import pytest

from support.imports import imported_by_name
from support.product import NOT_PRODUCT, ROOT, product_files

TESTS = os.path.dirname(os.path.abspath(__file__))
# "": the package's __init__.py (ComfyUI's entry point, the public names, imported on first use)
LAYERS = {"": 4, "__main__": 4, "nodes": 3, "cli": 3, "training": 2, "samplers": 1, "model_loaders": 0}
# samplers/, top to bottom: the entry point; the loop; what it is given; the phases; what they share; the basics; the sampling settings (no torch)
SAMPLER_LAYERS = {"__init__": 7, "api": 6, "engine": 5, "preview": 5, "decode_step": 4, "backends": 4, "stats": 4,
                  "threads": 4, "drafters": 3, "verification": 3, "compiled_step": 3,
                  "proposal": 2, "run_state": 2, "forward_costs": 2, "randomness": 1, "sampling": 0, "target": 1}
OUTSIDE = NOT_PRODUCT + ("devtools", "support")  # what the product never imports ("support": tests/support/)


def module_name(rel: str) -> str:
    """The module of a product file, without the package's name: samplers/api.py -> samplers.api, the package's
    __init__.py -> ""."""
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict:
    """module name -> file, for every .py of the product."""
    return {module_name(rel): os.path.join(ROOT, rel) for rel in product_files()}


def imported_modules(name: str, path: str, modules: dict) -> set:
    """Every module `name` imports, without the package's name (relative imports resolved; `from pkg import mod`
    names mod where mod is a module of `modules`; imports by name: `imported_by_name`)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = imported_by_name(tree, package)
    for node in ast.walk(tree):
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
    return found


def imports_of(name: str, path: str, modules: dict) -> set:
    """The product modules `name` imports (`imported_modules` that are in `modules`), the package itself ("")
    left out: importing any of its modules runs its __init__.py first anyway (`from .. import __version__`)."""
    return {m for m in imported_modules(name, path, modules) if m in modules and m not in (name, "")}


def imports_outside(modules: dict) -> list:
    """(product module, what it imports of tooling/, tests/, the test support or devtools/), sorted."""
    return sorted((name, m) for name, path in modules.items() for m in imported_modules(name, path, modules)
                  if m.split(".")[0] in OUTSIDE)


def import_graph() -> dict:
    modules = product_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def folder_graph(graph: dict) -> dict:
    """The imports between top folders (the package's entry points each its own): folder -> the other folders it
    imports."""
    top = lambda m: m.split(".")[0]  # noqa: E731
    out = {f: set() for f in LAYERS}
    for a, deps in graph.items():
        out[top(a)] |= {top(b) for b in deps if top(b) != top(a)}
    return out


def folder_cycles(graph: dict) -> list:
    return cycles(folder_graph(graph))


def part(module: str) -> str:
    """The part of samplers/ a samplers module belongs to (`samplers.drafters.base` -> drafters)."""
    return module.split(".")[1] if "." in module else "__init__"


def upward_in_samplers(graph: dict) -> list:
    """Imports between two parts of samplers/ that do not go to a lower layer (SAMPLER_LAYERS)."""
    inside = lambda m: m.split(".")[0] == "samplers"  # noqa: E731
    return sorted((a, b) for a, deps in graph.items() if inside(a) for b in deps if inside(b) and part(a) != part(b)
                  and SAMPLER_LAYERS[part(b)] >= SAMPLER_LAYERS[part(a)])


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
    assert "model_loaders.tiny" in graph["cli.model_spec"]
    assert "model_loaders.families.llama_adapter" in graph["model_loaders.tiny"] and "cli" in graph["__main__"]
    assert "samplers.drafters.hawk.network" in graph["training.hawk"]
    folders = folder_graph(graph)
    assert folders["cli"] >= {"samplers", "model_loaders"} and "samplers" in folders["training"]


def test_no_upward_import():
    assert upward_imports(import_graph()) == []


def test_no_upward_import_inside_samplers():
    graph = import_graph()
    assert {part(m) for m in graph if m.split(".")[0] == "samplers"} == set(SAMPLER_LAYERS)  # every part placed
    assert upward_in_samplers(graph) == []


def test_imports_by_name_are_read(tmp_path):
    """A literal name and each name of a module-level table, relative to `__package__` or absolute: the registry's
    families are read so."""
    (tmp_path / "m.py").write_text("import importlib\nTABLE = ('.a', '.b')\nMODS = [importlib.import_module(m, "
                                   "__package__) for m in TABLE]\n__import__('model_loaders.c')\n"
                                   "importlib.import_module('.d', 'specar.samplers')\n")
    modules = {m: "" for m in ("pkg.a", "pkg.b", "model_loaders.c", "samplers.d")}
    assert imports_of("pkg.m", str(tmp_path / "m.py"), modules) == set(modules)
    assert "model_loaders.families.chameleon" in import_graph()["model_loaders.registry"]


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
    ({"model_loaders.tiny": {"cli.args"}}, upward_imports),  # the tiny models importing the commands
    # two folders of one layer importing each other through modules that form no cycle: the folders do
    ({"cli.bench": {"nodes.core"}, "nodes.core": {"cli.args"}}, folder_cycles),
    ({"samplers.verification.step": {"samplers.drafters.base"}}, upward_in_samplers),  # two parts of one layer
    ({"samplers.proposal": {"samplers.verification.agreement"}}, upward_in_samplers),  # a part importing upward
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
    graph["cli.bench"] = graph["cli.bench"] | {"nodes.core"}
    graph["nodes.core"] = graph["nodes.core"] | {"cli.args"}
    assert cycles(graph) == [] and upward_imports(graph) == [] and folder_cycles(graph)


def test_the_product_imports_no_maintainer_or_test_code(tmp_path):
    """Neither tooling/ nor tests/ (nor the test support) is in the wheel: a product import of either breaks an
    installed package (planted: the package's __main__ passing commands on to the tooling, as it once did, and a
    tiny model taken from the test support)."""
    modules = product_modules()
    assert imports_outside(modules) == []
    (tmp_path / "__main__.py").write_text("from .cli import COMMANDS\nfrom .tooling import COMMANDS as TOOLING\n")
    (tmp_path / "spec.py").write_text("def tiny():\n    from support.exactness import tiny_model\n")
    planted = {**modules, "__main__": str(tmp_path / "__main__.py"), "cli.model_spec": str(tmp_path / "spec.py")}
    assert imports_outside(planted) == [("__main__", "tooling"), ("cli.model_spec", "support.exactness")]
