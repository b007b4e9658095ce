"""`python -m specar` (the user's commands) and `python -m specar.tooling` (the maintainers'): subcommands,
--version, help with the code's defaults, a maintainer's command passed on from `python -m specar` unlisted, and
bad arguments: one `error:` line, exit code 2, no traceback (unless --debug), before any work is done."""
import os
import re
import subprocess
import sys

import pytest

from specar import __version__, tooling
from specar.__main__ import main as module_main
from specar.cli import COMMANDS, main
from specar.cli.args import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, module="specar"):
    """`python -m MODULE ARGS` in a fresh interpreter: (exit code, stdout, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.dirname(ROOT)}
    p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(ROOT), timeout=300)
    return p.returncode, p.stdout, p.stderr


def listed(help_text: str) -> list:
    """The commands a program's --help lists (its `<command>` block)."""
    return re.findall(r"^    (\S+)", help_text.split("<command>\n", 1)[1].split("\noptions:")[0], re.M)


def test_version_and_help_exit_0_and_list_only_their_own_commands():
    code, out, err = run_cli("--version")
    assert (code, out.strip()) == (0, f"specar {__version__}"), err
    code, out, err = run_cli("--help")
    assert code == 0, err
    assert listed(out) == list(COMMANDS)  # the user's commands, none of the maintainers'
    code, out, err = run_cli("--help", module="specar.tooling")
    assert code == 0, err
    assert listed(out) == list(tooling.COMMANDS)
    assert not set(COMMANDS.modules) & set(tooling.COMMANDS.modules)


def test_a_maintainers_command_is_passed_on_from_python_m_specar(capsys):
    assert module_main(["gpu-check", "--plan-only"]) == 0
    assert "gpu-check plan" in capsys.readouterr().out
    assert module_main(["real-size", "--precisions", "fp8"]) == 2  # tooling's parser: its one-line error
    assert "error: argument --precisions: invalid choice: 'fp8'" in capsys.readouterr().err
    assert module_main(["demo", "--threads", "0"]) == 2  # the user's commands stay the user's
    assert "python -m specar demo" in capsys.readouterr().err


PROGRAMS = [(COMMANDS, c) for c in COMMANDS] + [(tooling.COMMANDS, c) for c in tooling.COMMANDS]


@pytest.mark.parametrize("program, command", PROGRAMS, ids=[c for _, c in PROGRAMS])
def test_command_help_is_whole_and_shows_the_codes_defaults(program, command, capsys):
    """Each command's docstring opens with its command line and a summary (the program's --help lists it); its
    --help shows the docstring whole and every option's default from the code (argparse prints it: a help text
    that also states one could drift from it)."""
    with pytest.raises(SystemExit) as e:
        program.parser(command).parse_args([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {program.prog} {command}")
    module = program.module(command)
    assert module.__doc__.startswith(f"`{program.prog} {command}`: ") and summary(module.__doc__)
    assert " ".join(module.__doc__.split()) in " ".join(out.split())  # the description is not cut
    sub = program.parser(command)._subparsers._group_actions[0].choices[command]
    for action in sub._actions:
        assert not re.search(r"\(default\b|default:", action.help or ""), (action.dest, action.help)
    with_default = [a for a in sub._actions if a.default is not None and a.default is not False and a.dest != "help"]
    assert " ".join(out.split()).count("(default: ") == len(with_default)


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
    (["gpu-check", "--samples", "0"], "--samples: must be an integer >= 1"),
    (["calibrate-regime", "flat"], "invalid choice: 'flat'"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) or "(none)" for a, _ in BAD])
def test_bad_arguments_give_one_error_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    """Through `python -m specar`'s dispatcher: the user's commands and the maintainers' it passes on."""
    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert module_main(argv) == 2
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
    code, out, err = run_cli("gpu-check", "--dry-run", "--stage-budget", "warp=3")  # passed on to the tooling's parser
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: --stage-budget must be"), err


def test_evaluate_demo_out_folder_is_checked_before_any_work(tmp_path):
    from specar.tooling.evaluate_demo import output_paths
    folder = tmp_path / "figs"
    folder.mkdir()
    assert output_paths(str(folder)) == (str(folder / "demo_prompts.png"), None)
    png, js = output_paths(str(tmp_path / "new" / "grid.png"), str(tmp_path / "new2" / "v.json"))
    assert os.path.isdir(tmp_path / "new") and os.path.isdir(tmp_path / "new2")
    assert png.endswith("grid.png") and js.endswith("v.json")
