"""What "the product" is, for the size budgets (tests/test_budgets.py) and the layer checks (tests/test_layers.py):
every tracked .py of the package outside tests/ and tooling/ (the maintainers' folder: neither is in the wheel).
"Tracked": what `git ls-files` lists in a checkout (build folders, venvs and output/ are not the product); outside
a checkout (an installed package, a test's folder) every .py found."""
import os
import subprocess

from . import PACKAGE as ROOT
NOT_PRODUCT = ("tests", "tooling")  # top folders
COMFYUI_LAYER = (("nodes", ".py"), ("web", ".js"))  # the ComfyUI layer: nodes/*.py and web/*.js


def tracked_files(root: str = ROOT) -> list:
    """Relative paths (with '/') of the files git tracks under `root`, or of every file there outside a checkout
    (hidden folders and __pycache__ left out)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=root, capture_output=True, timeout=60)
        if out.returncode == 0 and out.stdout:
            return sorted(p for p in out.stdout.decode().split("\0") if p)
    except OSError:  # no git
        pass
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        rel = os.path.relpath(folder, root)
        found += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in sorted(files)]
    return found


def _lines(root: str, rel: str) -> int:
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return sum(1 for _ in f)


def product_files(root: str = ROOT) -> dict:
    """relative path -> lines, for every .py of the product under `root`."""
    return {p: _lines(root, p) for p in tracked_files(root)
            if p.endswith(".py") and p.split("/")[0] not in NOT_PRODUCT and os.path.isfile(os.path.join(root, p))}


def comfyui_layer_files(root: str = ROOT) -> dict:
    """relative path -> lines, for nodes/*.py and web/*.js (`wc -l nodes/*.py web/*.js`)."""
    return {p: _lines(root, p) for p in tracked_files(root) for folder, ext in COMFYUI_LAYER
            if p.startswith(folder + "/") and p.count("/") == 1 and p.endswith(ext)}
