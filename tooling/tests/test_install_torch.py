"""The torch install of every make target (tooling/install_torch.py): the CPU build on Linux without an NVIDIA GPU, pip's
configured index when PyTorch's CPU index cannot be reached (a machine with a local mirror only), the user's
choice (TORCH_INDEX, TORCH_CUDA) over both."""
import os

import pytest

from specar.tooling import install_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
CPU = install_torch.CPU_INDEX


@pytest.mark.parametrize("env, platform, nvidia, reach, index, says", [
    ({}, "linux", False, True, CPU, "no NVIDIA GPU found"),
    ({}, "linux", False, False, None, "cannot be reached"),
    ({}, "linux", True, True, None, "NVIDIA driver is present"),
    ({"TORCH_CUDA": "1"}, "linux", False, True, None, "TORCH_CUDA"),
    ({"TORCH_INDEX": "https://example.org/whl"}, "linux", False, True, "https://example.org/whl", "TORCH_INDEX"),
    ({}, "darwin", False, True, None, "configured index"),
])
def test_the_index_follows_the_machine_and_the_users_choice(env, platform, nvidia, reach, index, says):
    chosen, why = install_torch.choose_index(env, platform, lambda: nvidia, lambda url: reach)
    assert chosen == index and says in why


def test_the_demo_installs_no_extras():
    """The demo's install line takes the package alone (no [test] / [glm-image]: pytest, diffusers) and shows pip's
    progress (no -q)."""
    text = open(os.path.join(ROOT, "Makefile")).read()
    rule = text[text.index("$(DEMO_STAMP):"):text.index("demo: $(DEMO_STAMP)")]
    pip_lines = [line for line in rule.splitlines() if "pip install" in line]
    assert pip_lines and all("-e ." in line and "[" not in line and " -q" not in line for line in pip_lines)


@pytest.mark.parametrize("target", ["test", "bench", "demo", "test-long", "test-comfyui", "test-floor"])
def test_every_target_installs_torch_through_the_one_installer(target, tmp_path):
    """`make -n <target>` with a fresh venv: torch comes from install_torch.py (the CPU build on Linux without an
    NVIDIA GPU, above), never from a bare `pip install torch` (PyPI's 2.5 GB CUDA build); bench installs the package
    without the test / glm-image extras (planted: `bench: $(STAMP)` installed pytest and diffusers)."""
    import shutil
    import subprocess
    if shutil.which("make") is None:
        pytest.skip("no make here")
    out = subprocess.run(["make", "-n", "-C", ROOT, f"VENV={tmp_path / 'venv'}", f"FLOOR_VENV={tmp_path / 'floor'}",
                          target], capture_output=True, text=True, check=True).stdout
    installs = [line for line in out.splitlines() if "pip install" in line or "install_torch.py" in line]
    assert any("install_torch.py" in line for line in installs), out
    assert not any("pip install" in line and "torch" in line.split("pip install", 1)[1] for line in installs), out
    if target in ("bench", "demo"):
        assert not any("[test" in line or "glm-image" in line for line in installs), out
