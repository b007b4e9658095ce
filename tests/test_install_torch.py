"""`make demo`'s torch install (devtools/install_torch.py): the CPU build on Linux without an NVIDIA GPU, pip's
configured index when PyTorch's CPU index cannot be reached (a machine with a local mirror only), the user's
choice (TORCH_INDEX, TORCH_CUDA) over both."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("install_torch", os.path.join(ROOT, "devtools", "install_torch.py"))
install_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_torch)
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
    assert "install_torch.py" in rule
