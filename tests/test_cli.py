"""`python -m specar`: subcommands, --version, help with defaults, and bad arguments: one `error:` line,
exit code 2, no traceback (unless --debug), before any work is done."""
import os
import subprocess
import sys

import pytest

from specar import __version__
from specar.cli import COMMANDS, PASS_THROUGH, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args):
    """`python -m specar ARGS` in a fresh interpreter: (exit code, stdout, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.dirname(ROOT)}
    p = subprocess.run([sys.executable, "-m", "specar", *args], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(ROOT), timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_version_and_help_exit_0():
    code, out, err = run_cli("--version")
    assert (code, out.strip()) == (0, f"specar {__version__}"), err
    code, out, err = run_cli("--help")
    assert code == 0, err
    for command in COMMANDS:
        assert command in out


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in PASS_THROUGH])
def test_command_help_is_whole_and_shows_defaults(command, capsys):
    with pytest.raises(SystemExit) as e:
        from specar.cli import parser
        parser().parse_args([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m specar {command}")
    module = __import__(f"specar.cli.{COMMANDS[command][0]}", fromlist=["_"])
    first_paragraph = module.__doc__.strip().split("\n\n")[0]
    assert " ".join(first_paragraph.split()) in " ".join(out.split())  # the description is not cut
    if command in ("demo", "train-drafter", "shape-bench", "evaluate-demo", "compile-rows"):
        assert "(default: " in out


BAD = [
    (["nope"], "invalid choice: 'nope'"),
    ([], "no command given"),
    (["demo", "--threads", "0"], "--threads: must be an integer >= 1, got '0'"),
    (["demo", "--seed", "-1"], "--seed: must be an integer >= 0, got '-1'"),
    (["demo", "--fast", "sjd:window=abc"], "--fast 'sjd:window=abc'"),
    (["demo", "--fast", "warp"], "unknown backend 'warp'"),
    (["train-drafter", "--kind", "hawk", "--out", "OUT", "--batch", "0"], "--batch: must be an integer >= 1"),
    (["train-drafter", "--kind", "hawk", "--out", "OUT", "--steps", "-1"], "--steps: must be an integer >= 0"),
    (["train-drafter", "--kind", "hawk", "--out", "OUT", "--lr", "0"], "--lr: must be a number > 0"),
    (["train-drafter", "--kind", "warp", "--out", "OUT"], "invalid choice: 'warp'"),
    (["shape-bench", "--repeats", "0"], "--repeats: must be an integer >= 1"),
    (["shape-bench", "--windows", "16", "x"], "--windows: must be an integer >= 1, got 'x'"),
    (["compile-rows", "--tokens", "0"], "--tokens: must be an integer >= 1, got '0'"),
    (["evaluate-demo", "--out", "grid.txt"], "--out must be an image file"),
    (["evaluate-demo", "--samples", "0"], "--samples: must be an integer >= 1"),
    (["convert-checkpoint", "missing.pt", "x.safetensors"], "checkpoint file missing.pt is missing"),
    (["bench", "--backends", "warp"], "unknown backend 'warp'"),
    (["bench", "--threads", "0", "--backends", "ar"], "error:"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) or "(none)" for a, _ in BAD])
def test_bad_arguments_give_one_error_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing was trained or written


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="unknown backend 'warp'"):
        main(["--debug", "demo", "--fast", "warp"])


def test_real_process_error_is_one_line():
    code, out, err = run_cli("train-drafter", "--kind", "hawk", "--out", "x", "--batch", "0")
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: argument --batch"), err


def test_evaluate_demo_out_folder_is_checked_before_any_work(tmp_path):
    from specar.cli.evaluate_demo import output_paths
    folder = tmp_path / "figs"
    folder.mkdir()
    assert output_paths(str(folder)) == (str(folder / "demo_prompts.png"), None)
    png, js = output_paths(str(tmp_path / "new" / "grid.png"), str(tmp_path / "new2" / "v.json"))
    assert os.path.isdir(tmp_path / "new") and os.path.isdir(tmp_path / "new2")
    assert png.endswith("grid.png") and js.endswith("v.json")
