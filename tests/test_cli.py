"""`python -m specar` (the user's commands): subcommands, --version, help with the code's defaults, no maintainer's
command (those are `python -m specar.tooling`'s, tooling/tests/test_tooling_cli.py), and bad arguments: one `error:`
line, exit code 2, no traceback (unless --debug), before any work is done."""
import pytest

from specar import __version__
from specar.__main__ import main as module_main
from specar.cli import COMMANDS, main
from support.commands import check_command_help, check_one_error_line, listed, run_module


def run_cli(*args):
    return run_module("specar", *args)


def test_version_and_help_exit_0_and_list_only_their_own_commands():
    code, out, err = run_cli("--version")
    assert (code, out.strip()) == (0, f"specar {__version__}"), err
    code, out, err = run_cli("--help")
    assert code == 0, err
    assert listed(out) == list(COMMANDS)  # the user's commands, none of the maintainers'


def test_a_maintainers_command_is_not_the_products(capsys):
    """The product never imports the maintainers' tooling: `python -m specar gpu-check` is an unknown command."""
    assert module_main(["gpu-check", "--plan-only"]) == 2
    assert "invalid choice: 'gpu-check'" in capsys.readouterr().err
    assert module_main(["demo", "--threads", "0"]) == 2
    assert "python -m specar demo" in capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_help_is_whole_and_shows_the_codes_defaults(command, capsys):
    check_command_help(COMMANDS, command, capsys)


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
    (["convert-checkpoint", "missing.pt", "x.safetensors"], "checkpoint file missing.pt is missing"),
    (["bench", "--backends", "warp"], "unknown backend 'warp'"),
    (["bench", "--threads", "0", "--backends", "ar"], "error:"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) or "(none)" for a, _ in BAD])
def test_bad_arguments_give_one_error_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_one_error_line(module_main, argv, message, capsys, tmp_path)


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="unknown backend 'warp'"):
        main(["--debug", "demo", "--fast", "warp"])


def test_real_process_error_is_one_line():
    code, out, err = run_cli("train-drafter", "--kind", "hawk", "--out", "x", "--batch", "0")
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: argument --batch"), err
