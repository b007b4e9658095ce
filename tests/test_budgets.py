"""Size budgets of the product (every .py outside tests/, devtools/ and tooling/, which are not shipped to users):
no module over MODULE_LINES (a module with one job reads in a few screens), and the whole no larger than
PRODUCT_LINES. A change that needs more raises PRODUCT_LINES in the same commit, where a reviewer sees it."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_PRODUCT = {"tests", "devtools", "tooling", "output", "docs", "example_workflows", "web"}
MODULE_LINES = 400
PRODUCT_LINES = 15233  # 2026-11-29 (14,386 at ca99bb4; issues 53-55 and 57 added the rest; issue 56: -15)


def product_files(root: str = ROOT) -> dict:
    """relative path -> lines, for every .py of the product under `root`."""
    out = {}
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in NOT_PRODUCT and not d.startswith(".")]
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    out[os.path.normpath(os.path.join(rel, f))] = sum(1 for _ in fh)
    return out


def over_budget(files: dict) -> list:
    """What breaks a budget, in words (empty: nothing)."""
    found = [f"{path}: {n} lines (at most {MODULE_LINES})" for path, n in sorted(files.items()) if n > MODULE_LINES]
    total = sum(files.values())
    if total > PRODUCT_LINES:
        found.append(f"the product: {total} lines (budget {PRODUCT_LINES})")
    return found


def test_no_module_over_its_budget_and_the_product_within_its_own():
    files = product_files()
    assert "samplers/engine.py" in files and "__init__.py" in files and not any(p.startswith("tests") for p in files)
    assert over_budget(files) == []


def test_a_planted_long_module_and_a_grown_product_are_caught(tmp_path):
    (tmp_path / "samplers").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "samplers" / "big.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    (tmp_path / "tests" / "huge.py").write_text("x = 1\n" * (PRODUCT_LINES + 1))  # tests are not the product
    assert over_budget(product_files(str(tmp_path))) == [f"samplers/big.py: {MODULE_LINES + 1} lines (at most 400)"]
    files = product_files()
    grown = {**files, "samplers/new.py": PRODUCT_LINES - sum(files.values()) + 1}  # one line past the budget
    assert over_budget(grown)[-1] == f"the product: {PRODUCT_LINES + 1} lines (budget {PRODUCT_LINES})"
