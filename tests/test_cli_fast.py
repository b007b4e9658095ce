"""The command line answers argument mistakes and --help before torch is imported: every command's
--help, and a bad value of each kind, in a fresh Python whose sys.modules is checked afterwards (the checks read the
registry itself, which imports no torch); --help names the default backend."""
import os
import subprocess
import sys
import time

import pytest

import specar
from specar.cli import model_spec
from specar.samplers.backends import DEFAULT_BACKEND

SPECAR_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(specar.__file__)))
COMMANDS = ["demo", "bench", "train-drafter", "convert-checkpoint", "convert-drafter"]
# (argv, what the one error line names)
BAD = [
    (["bench", "--model", "tiny:16,0x8"], "--model"),
    (["bench", "--backends", "nosuch"], "unknown backend 'nosuch'; backends: ar,"),
    (["bench", "--backends", "sjd:window=0"], "window must be an int in [1, 128], got 0"),
    (["bench", "--backends", "sjd:warp=1"], "has no parameter warp"),
    (["bench", "--backends", "auto:max_window=abc"], "max_window must be an int"),
    (["bench", "--backends", "scd:coupling=best"], "coupling must be one of maximal, gumbel"),
    (["bench", "--windows", "200"], "--windows: window must be an int in [1, 128]"),
    (["bench", "--resolution", "big"], "--resolution must be WIDTHxHEIGHT"),
    (["bench", "--model", "demo", "--quantize", "int4", "--offload", "auto"], "does not combine with --offload"),
    (["bench", "--model", "tiny:16,4x4", "--dtype", "float16"], "--dtype: only for a model loaded from files"),
    (["bench", "--regime", "flat", "--model", "demo"], "--regime flat fixes the model"),
    (["bench", "--prompts", "no-such-file.txt"], "--prompts: no such file"),
    (["bench", "--top-p", "2"], "top_p must be a number in (0, 1] (1.0 = no top-p), got 2.0"),
    (["demo", "--fast", "nosuch"], "--fast 'nosuch': unknown backend 'nosuch'; backends"),
    (["demo", "--fast", "sjd:window=0"], "--fast 'sjd:window=0'"),
    (["demo", "--resolution", "64"], "--resolution must be WIDTHxHEIGHT"),
    (["demo", "--offload", "cpu"], "--offload"),
    (["demo", "--threads", "0"], "--threads"),
    (["convert-checkpoint", "missing.pt", "out.safetensors"], "missing.pt is missing"),
    (["convert-drafter", "no-such-folder", "--kind", "lantern", "--model", "demo"], "no such drafter folder"),
    (["train-drafter", "--kind", "hawk", "--out", "o", "--prompts", "none.txt"], "--prompts: no such file"),
    (["train-drafter", "--kind", "warp", "--out", "o"], "--kind"),
    # the five that waited for torch (5-6.5 s each), and a file that is no checkpoint: answered before it too
    (["demo", "--resolution", "100x100"], "'demo' generates at its own size only"),
    (["demo", "--model", "no-such-folder"], "--model 'no-such-folder': no such folder"),
    (["demo", "--model", "empty"], "--model 'empty': the folder is empty"),
    (["demo", "--offload", "auto"], "--offload: the built-in model 'demo'"),
    (["demo", "--device", "cuda"], "--device cuda: no CUDA GPU is available here"),
    (["convert-checkpoint", "bad.pt", "out.safetensors"], "bad.pt is not a torch checkpoint"),
]

CHECK = """
import sys
from specar.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)
print("IMPORTED:" + ",".join(heavy))
sys.exit(code)
"""


def _run(argv, cwd):
    os.makedirs(os.path.join(cwd, "empty"), exist_ok=True)
    with open(os.path.join(cwd, "bad.pt"), "w") as f:
        f.write("not a checkpoint\n")
    started = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=300, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": SPECAR_PARENT})
    imported = next(line for line in p.stdout.splitlines() if line.startswith("IMPORTED:"))[len("IMPORTED:"):]
    return p.returncode, p.stdout, p.stderr, imported, time.perf_counter() - started


@pytest.mark.parametrize("command", COMMANDS)
def test_help_imports_no_torch_and_names_the_default_backend(command, tmp_path):
    code, out, err, imported, _ = _run([command, "--help"], tmp_path)
    assert code == 0, err
    assert imported == "", f"{command} --help imported {imported}"
    if command in ("demo", "bench"):
        assert f"{DEFAULT_BACKEND}, the library's default backend" in " ".join(out.split()) or \
            f"the default backend (API, node, demo): {DEFAULT_BACKEND}" in " ".join(out.split())
    assert ".py" not in out, "a help text cites a source file a wheel user does not have"


@pytest.mark.parametrize("argv, names", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_one_error_line_before_torch(argv, names, tmp_path):
    """Each mistake is one `error:` line naming it, with neither torch, transformers nor numpy imported, in under a
    second at low load (a Python start and the parser: 0.05-0.2 s; 5 s when torch loads first). `--device cuda`:
    refused early on a machine without a GPU, else it passes the early checks (skipped)."""
    if argv[-1] == "cuda" and not model_spec.no_cuda_here():
        pytest.skip("a GPU may be here: torch's check answers")
    code, out, err, imported, seconds = _run(argv, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert names in lines[0], lines[0]
    assert imported == "", f"{' '.join(argv)} imported {imported} before refusing"
    assert "ImageGeometry" not in lines[0] and " in 'nosuch'" not in lines[0]
    if os.getloadavg()[0] < (os.cpu_count() or 1):  # a loaded machine only slows the Python start
        assert seconds < 1.0, f"{seconds:.2f} s"


def test_a_bad_sampling_value_is_one_message_from_the_command_line_and_python(tmp_path):
    """One check of a sampling value (SamplingParams.validated): the command line's error line is generate's."""
    from specar.model_loaders.tiny import tiny_model
    code, _, err, imported = _run(["bench", "--temperature", "-0.5"], tmp_path)[:4]
    with pytest.raises(ValueError) as python:
        specar.generate(tiny_model(16, (2, 2), seed=3), "hi", backend="ar", sampling=dict(temperature=-0.5))
    assert code == 2 and imported == "" and err.startswith(f"error: {python.value} ("), (err, str(python.value))


def test_an_unsafe_checkpoint_is_refused_in_whole_sentences_with_a_conversion_that_runs(tmp_path, capsys):
    """convert-checkpoint on a checkpoint holding a pickled object (argparse.Namespace, as the authors' training
    scripts save): one error line naming it, no sentence cut, and the suggested conversion runs as written
    (planted: the old `['state_dict' or 'model']` raised KeyError on a {'model': ...} checkpoint)."""
    import argparse
    import re
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    from specar.cli import main
    src, out = tmp_path / "c2i.pt", tmp_path / "OUT.safetensors"
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=1)}, src)
    assert main(["convert-checkpoint", str(src), str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argparse.Namespace" in err and " )" not in err, err
    code = re.search(r"`(import torch.*?)`", err).group(1)
    code = code.replace("PATH", repr(str(src))).replace("'OUT.safetensors'", repr(str(out)))
    subprocess.run([sys.executable, "-c", code], check=True)  # as the user runs it (no exec: the Registry's scan)
    assert torch.equal(load_file(str(out))["w"], torch.ones(2))
