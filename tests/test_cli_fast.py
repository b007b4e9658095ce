"""The command line answers argument mistakes and --help before torch is imported (issue 55): every command's
--help, and a bad value of each kind, in a fresh Python whose sys.modules is checked afterwards; the backends'
snapshot the checks read (cli/backends.json) equals the registry; --help names the default backend."""
import json
import os
import subprocess
import sys

import pytest

import specar
from specar.cli import schema

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
    (["demo", "--fast", "nosuch"], "--fast 'nosuch': unknown backend 'nosuch'; backends"),
    (["demo", "--fast", "sjd:window=0"], "--fast 'sjd:window=0'"),
    (["demo", "--resolution", "64"], "--resolution must be WIDTHxHEIGHT"),
    (["demo", "--offload", "cpu"], "--offload"),
    (["demo", "--threads", "0"], "--threads"),
    (["convert-checkpoint", "missing.pt", "out.safetensors"], "missing.pt is missing"),
    (["convert-drafter", "no-such-folder", "--kind", "lantern", "--model", "demo"], "no such drafter folder"),
    (["train-drafter", "--kind", "hawk", "--out", "o", "--prompts", "none.txt"], "--prompts: no such file"),
    (["train-drafter", "--kind", "warp", "--out", "o"], "--kind"),
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
    p = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, timeout=300, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": SPECAR_PARENT})
    imported = next(line for line in p.stdout.splitlines() if line.startswith("IMPORTED:"))[len("IMPORTED:"):]
    return p.returncode, p.stdout, p.stderr, imported


@pytest.mark.parametrize("command", COMMANDS)
def test_help_imports_no_torch_and_names_the_default_backend(command, tmp_path):
    code, out, err, imported = _run([command, "--help"], tmp_path)
    assert code == 0, err
    assert imported == "", f"{command} --help imported {imported}"
    if command in ("demo", "bench"):
        assert f"{schema.DEFAULT_BACKEND}, the library's default backend" in " ".join(out.split()) or \
            f"the default backend (API, node, demo): {schema.DEFAULT_BACKEND}" in " ".join(out.split())
    assert ".py" not in out, "a help text cites a source file a wheel user does not have"


@pytest.mark.parametrize("argv, names", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_one_error_line_before_torch(argv, names, tmp_path):
    code, out, err, imported = _run(argv, tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert names in lines[0], lines[0]
    assert imported == "", f"{' '.join(argv)} imported {imported} before refusing"
    assert "ImageGeometry" not in lines[0] and " in 'nosuch'" not in lines[0]


def test_the_snapshot_is_the_registry():
    """cli/backends.json is what the registry says now (after a backend or parameter changes: python -m
    specar.cli.schema rewrites it)."""
    with open(schema.SNAPSHOT, encoding="utf-8") as f:
        assert json.load(f) == json.loads(json.dumps(schema.snapshot())), "run: python -m specar.cli.schema"


def test_the_early_checks_agree_with_the_registry():
    """Every value the registry refuses, the snapshot refuses too, with the same words."""
    from specar.cli.benchmark import parse_config
    for text in ("sjd:window=129", "auto:max_window=0", "sjd_pac:tree_width=0", "hawk:node_budget=1",
                 "scd:coupling_strength=2.5", "sjd:init=left"):
        with pytest.raises(ValueError) as early:
            schema.parse_config(text)
        with pytest.raises(ValueError) as full:
            parse_config(text)
        assert str(early.value) == str(full.value)


def test_an_unsafe_checkpoint_is_refused_in_whole_sentences_with_a_conversion_that_runs(tmp_path, capsys):
    """convert-checkpoint on a checkpoint holding a pickled object (argparse.Namespace, as the authors' training
    scripts save): one error line naming it, no sentence cut, and the suggested conversion runs as written
    (planted: the old `['state_dict' or 'model']` raised KeyError on a {'model': ...} checkpoint)."""
    import argparse
    import re

    import torch
    from safetensors.torch import load_file

    from specar.cli import main
    src, out = tmp_path / "c2i.pt", tmp_path / "OUT.safetensors"
    torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=1)}, src)
    assert main(["convert-checkpoint", str(src), str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argparse.Namespace" in err and " )" not in err, err
    code = re.search(r"`(import torch.*?)`", err).group(1)
    exec(code.replace("PATH", repr(str(src))).replace("'OUT.safetensors'", repr(str(out))), {})
    assert torch.equal(load_file(str(out))["w"], torch.ones(2))
