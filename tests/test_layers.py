"""The product modules' imports: no upward import between layers and no import cycle, between
modules and between folders.

Layers, top to bottom: tooling/ > nodes/, cli/ > training/, testing.py > samplers/ > model_loaders/. A module
imports only its own layer or those below it. Every import counts, also one inside a function (a lazy
import hides a cycle from Python, not from the reader) and one by name (`importlib.import_module` or
`__import__` of a string, or of each name of a module-level tuple of strings). The folders' graph (one node
per top folder, testing.py its own) has no cycle either: two folders of one layer may not import each
other, even through modules that do not form a cycle. Inside samplers/ the parts (its modules and
folders) have layers of their own, SAMPLER_LAYERS: a part imports only parts of a lower layer."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = {"tooling": 4, "nodes": 3, "cli": 3, "training": 2, "testing": 2, "samplers": 1, "model_loaders": 0}
PRODUCT = tuple(LAYERS)  # folders, and testing.py (the tiny models of the bench and the tests)
# samplers/, top to bottom: the entry point; the loop; what it is given; the phases; what they share; the basics
SAMPLER_LAYERS = {"__init__": 6, "api": 5, "engine": 4, "preview": 4, "backends": 3, "stats": 3, "threads": 3, "forward_costs": 3,
                  "drafters": 2, "verification": 2, "compiled_step": 2, "proposal": 1, "run_state": 1,
                  "randomness": 0, "target": 0}


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


def imported_by_name(tree: ast.Module, package: str) -> set:
    """The modules a module imports by name: `importlib.import_module(NAME[, PACKAGE])` or `__import__(NAME)`,
    NAME a string or a variable that runs over a module-level tuple (or list) of strings, PACKAGE
    `__package__` or a string."""
    tables = {t.id: [e.value for e in node.value.elts] for node in tree.body if isinstance(node, ast.Assign)
              and isinstance(node.value, (ast.Tuple, ast.List)) and node.value.elts
              and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)
              for t in node.targets if isinstance(t, ast.Name)}
    loops = {n.target.id: tables[n.iter.id] for n in ast.walk(tree) if isinstance(n, (ast.comprehension, ast.For))
             and isinstance(n.target, ast.Name) and isinstance(n.iter, ast.Name) and n.iter.id in tables}
    found = set()
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and call.args and ast.unparse(call.func) in
                ("importlib.import_module", "import_module", "__import__")):
            continue
        arg = call.args[0]
        names = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else \
            loops.get(arg.id, tables.get(arg.id, [])) if isinstance(arg, ast.Name) else []
        base = call.args[1] if len(call.args) > 1 and ast.unparse(call.func) != "__import__" else None
        base = package if isinstance(base, ast.Name) and base.id == "__package__" else \
            base.value.removeprefix("specar.") if isinstance(base, ast.Constant) else None
        for n in names:
            level = len(n) - len(n.lstrip("."))
            if level and base is not None:
                parts = base.split(".")
                found.add(".".join(filter(None, [".".join(parts[:len(parts) - level + 1]), n[level:]])))
            elif not level:
                found.add(n.removeprefix("specar."))
    return found


def imports_of(name: str, path: str, modules: dict) -> set:
    """The product modules `name` imports (relative imports resolved; `from pkg import mod` names mod; imports by
    name: `imported_by_name`)."""
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
    assert "testing" in graph["cli.model_spec"] and "model_loaders.families.llama_adapter" in graph["testing"]
    assert "samplers.api" in graph["tooling.testing"] and "testing" in graph["tooling.testing"]
    assert "samplers.drafters.hawk.network" in graph["training.hawk"]
    folders = folder_graph(graph)
    assert folders["cli"] >= {"testing", "samplers", "model_loaders"} and "samplers" in folders["training"]


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
    ({"testing": {"cli.args"}}, upward_imports),  # testing.py importing the commands
    # two folders of one layer importing each other through modules that form no cycle: the folders do
    ({"training.hawk": {"testing"}, "testing": {"training.loop"}}, folder_cycles),
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
    graph["training.hawk"] = graph["training.hawk"] | {"testing"}
    graph["testing"] = graph["testing"] | {"training.loop"}
    assert cycles(graph) == [] and upward_imports(graph) == [] and folder_cycles(graph)
