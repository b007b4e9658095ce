"""Size budgets of the product (tests/support/product.py: every tracked .py outside tests/ and tooling/, which are
not shipped to users): no module over MODULE_LINES (a module with one job reads in a few screens), the whole no
larger than PRODUCT_LINES and the ComfyUI layer (nodes/*.py, web/*.js) no larger than COMFYUI_LINES. The budgets
are targets with headroom, not today's counts: a change that needs more makes room elsewhere first."""
from support.product import comfyui_layer_files, product_files

MODULE_LINES = 400
PRODUCT_LINES = 14500  # the Emu3.5 family included
COMFYUI_LINES = 2600


def over_budget(files: dict, comfyui: dict) -> list:
    """What breaks a budget, in words (empty: nothing)."""
    found = [f"{path}: {n} lines (at most {MODULE_LINES})" for path, n in sorted(files.items()) if n > MODULE_LINES]
    for what, counted, budget in (("the product", files, PRODUCT_LINES), ("the ComfyUI layer", comfyui, COMFYUI_LINES)):
        if sum(counted.values()) > budget:
            found.append(f"{what}: {sum(counted.values())} lines (budget {budget})")
    return found


def test_no_module_over_its_budget_and_the_product_and_its_comfyui_layer_within_theirs():
    files, comfyui = product_files(), comfyui_layer_files()
    assert "samplers/engine.py" in files and "__init__.py" in files and "nodes/v1.py" in comfyui
    assert not any(p.startswith(("tests/", "tooling/")) for p in files)
    assert over_budget(files, comfyui) == []


def test_planted_long_module_grown_product_and_grown_comfyui_layer_are_caught(tmp_path):
    for folder in ("samplers", "tests", "tooling", "nodes", "web"):
        (tmp_path / folder).mkdir()
    (tmp_path / "samplers" / "big.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    (tmp_path / "tests" / "huge.py").write_text("x = 1\n" * (PRODUCT_LINES + 1))  # tests are not the product
    (tmp_path / "tooling" / "huge.py").write_text("x = 1\n" * (PRODUCT_LINES + 1))  # nor is the maintainers' folder
    (tmp_path / "nodes" / "n.py").write_text("x = 1\n" * 300)
    (tmp_path / "web" / "w.js").write_text("x = 1;\n" * (COMFYUI_LINES - 299))
    files, comfyui = product_files(str(tmp_path)), comfyui_layer_files(str(tmp_path))
    assert set(files) == {"samplers/big.py", "nodes/n.py"} and sum(comfyui.values()) == COMFYUI_LINES + 1
    assert over_budget(files, comfyui) == [f"samplers/big.py: {MODULE_LINES + 1} lines (at most 400)",
                                           f"the ComfyUI layer: {COMFYUI_LINES + 1} lines (budget {COMFYUI_LINES})"]
    grown = {**files, "samplers/new.py": PRODUCT_LINES - sum(files.values()) + 1}  # one line past the budget
    assert over_budget(grown, {})[-1] == f"the product: {PRODUCT_LINES + 1} lines (budget {PRODUCT_LINES})"
