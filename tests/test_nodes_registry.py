"""What the ComfyUI Registry checks before it publishes the pack (`comfy node validate`, from comfy-cli): no exec or
eval call and no two statements on one line in any Python file of the checkout, tests included (it runs ruff's S102,
S307 and E702 over the whole folder), and pyproject's [project] / [tool.comfy] as its parser reads them. .ci/run runs
the validator itself on a fresh clone (comfy-cli and ruff are no test requirement); this keeps the checkout clean
between CI runs."""
import ast
import io
import os
import re
import subprocess
import tokenize

import pytest

from support import CHECKOUT as ROOT, needs_checkout


def registry_findings(source: str, path: str = "<source>") -> list:
    """The validator's findings in one file: exec / eval called (S102, S307), a ';' between statements (E702)."""
    calls = [f"{path}:{n.lineno}: {n.func.id}()" for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("exec", "eval")]
    semicolons = [f"{path}:{t.start[0]}: ';'" for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type == tokenize.OP and t.string == ";"]
    return calls + semicolons


def test_the_scan_finds_what_the_registry_refuses():
    planted = "import torch\nexec('x = 1')\ny = eval('2'); z = 3\nmodel = torch.nn.Linear(1, 1).eval()  # a method\n"
    assert [f.split(": ", 1)[1] for f in registry_findings(planted)] == ["exec()", "eval()", "';'"]


@needs_checkout
def test_no_file_of_the_checkout_has_exec_eval_or_two_statements_on_a_line():
    try:
        files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the Registry publishes from one")
    found = []
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            found += registry_findings(f.read(), rel)
    assert not found, found


@needs_checkout
def test_pyproject_has_what_the_registry_reads():
    tomllib = pytest.importorskip("tomllib", reason="Python < 3.11: no tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        data = tomllib.load(f)
    project, comfy = data["project"], data["tool"]["comfy"]
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]{0,98}", project["name"]) and "comfyui" not in project["name"].lower()
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"]) and project["urls"]["Repository"].startswith("https://")
    assert comfy["PublisherId"] and comfy["DisplayName"]
    assert "Icon" not in comfy or re.match(r"https://\S+$", comfy["Icon"]), comfy.get("Icon")  # a URL or absent
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        floor = re.search(r"^COMFYUI_FLOOR=(\S+)", f.read(), re.M).group(1)
    assert comfy["requires-comfyui"] == f">={floor}"  # the oldest ComfyUI the CI runs the pack in
