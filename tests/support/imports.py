"""Reading a module's imports by name (tests/test_layers.py's graph, tests/test_suite_rules.py's check of the tests'
own imports)."""
import ast


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
