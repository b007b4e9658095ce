"""The test suite's own rules: the tests import the product (`specar`) and their support (`support`,
tests/support/), nothing of the maintainers' code (tooling/, once devtools/), so that they run against an installed
package; a test's docstring and a file's name under tests/ say what is checked, not when or for which issue."""
import ast
import os
import re

from support.imports import imported_by_name

TESTS = os.path.dirname(os.path.abspath(__file__))
JOURNAL = re.compile(r"\b[Ii]ssues? ?#?\d+|\b20\d\d-\d\d-\d\d\b|\b20\d\d-\d\d\b")  # issue numbers, dates


def files_of_the_tests() -> list:
    """Every .py under tests/ (the tests, their conftests and tests/support/)."""
    return sorted(os.path.join(folder, f) for folder, dirs, files in os.walk(TESTS) for f in files
                  if f.endswith(".py") and "__pycache__" not in folder)


def maintainer_imports(path: str) -> list:
    """What a test file imports of the maintainers' code: `specar.tooling` or a `tooling` / `devtools` module by
    import statement or by name, a command line running one (`-m specar.tooling`), or a file under tooling/ or
    devtools/ loaded by path (`spec_from_file_location` with a string naming the folder)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set(imported_by_name(tree, ""))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.List):  # a command line: [sys.executable, "-m", "specar.tooling", ...]
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            names.update(b for a, b in zip(items, items[1:]) if a == "-m" and isinstance(b, str))
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("spec_from_file_location"):
            names.update(c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                         and isinstance(c.value, str) and c.value.strip("/") in ("tooling", "devtools"))
    return sorted(n for n in names if n.removeprefix("specar.").split(".")[0] in ("tooling", "devtools"))


def journal_words(path: str) -> list:
    """(where, what) for every issue number or date in the docstrings of a .py file."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    return [(getattr(node, "name", "module"), m) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            for m in JOURNAL.findall(ast.get_docstring(node) or "")]


def test_no_test_imports_the_maintainers_code():
    """The tests import `specar` (the product) and `support` (tests/support/), nothing of tooling/ or devtools/, so
    they run against an installed package."""
    found = {os.path.relpath(p, TESTS): maintainer_imports(p) for p in files_of_the_tests()}
    assert len(found) > 60 and "support/exactness.py" in found
    assert {p: names for p, names in found.items() if names} == {}


def test_planted_maintainer_imports_in_a_test_are_caught(tmp_path):
    planted = {"from specar.tooling import roofline": ["specar.tooling", "specar.tooling.roofline"],
               "import specar.tooling.testing": ["specar.tooling.testing"],
               "importlib.import_module('specar.tooling.memory')": ["tooling.memory"],
               "spec = importlib.util.spec_from_file_location('x', os.path.join(ROOT, 'devtools', 'x.py'))": ["devtools"],
               "cmd = [sys.executable, '-m', 'specar.tooling', 'shape-bench']": ["specar.tooling"],
               "from specar.nodes import core": []}
    for code, names in planted.items():
        (tmp_path / "test_planted.py").write_text(code + "\n")
        assert maintainer_imports(str(tmp_path / "test_planted.py")) == names, code


def test_no_issue_number_or_date_in_a_test_docstring_or_a_file_name():
    names = [os.path.relpath(os.path.join(folder, f), TESTS) for folder, dirs, files in os.walk(TESTS)
             for f in files + dirs if "__pycache__" not in folder]
    assert len(names) > 60 and [n for n in names if JOURNAL.search(n) or re.search(r"issue", n, re.I)] == []
    found = {os.path.relpath(p, TESTS): journal_words(p) for p in files_of_the_tests()}
    assert {p: words for p, words in found.items() if words} == {}


def test_planted_issue_numbers_and_dates_are_caught(tmp_path):
    (tmp_path / "test_x.py").write_text('"""Issue 36: the window."""\n\n\ndef test_a():\n    """As of 2026-11-28."""\n'
                                        '\n\ndef test_b():\n    """The window of issue 7 and 2026-11."""\n')
    assert journal_words(str(tmp_path / "test_x.py")) == [("module", "Issue 36"), ("test_a", "2026-11-28"),
                                                           ("test_b", "issue 7"), ("test_b", "2026-11")]
    assert JOURNAL.search("bench_issue26_x.json") is None and re.search(r"issue", "bench_issue26_x.json")
