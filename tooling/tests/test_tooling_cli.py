"""`python -m specar.tooling` (the maintainers' commands): its help lists only its own commands, each command's help
is whole with the code's defaults, and a bad argument gives one `error:` line, exit code 2, no traceback."""
import os

import pytest

from specar import tooling
from specar.cli import COMMANDS
from support.commands import check_command_help, check_one_error_line, listed, run_module


def run_tooling(*args):
    return run_module("specar.tooling", *args)


def test_help_lists_only_the_maintainers_commands():
    code, out, err = run_tooling("--help")
    assert code == 0, err
    assert listed(out) == list(tooling.COMMANDS)
    assert not set(COMMANDS.modules) & set(tooling.COMMANDS.modules)


@pytest.mark.parametrize("command", list(tooling.COMMANDS))
def test_command_help_is_whole_and_shows_the_codes_defaults(command, capsys):
    check_command_help(tooling.COMMANDS, command, capsys)


BAD = [
    (["shape-bench", "--repeats", "0"], "--repeats: must be an integer >= 1"),
    (["shape-bench", "--windows", "16", "x"], "--windows: must be an integer >= 1, got 'x'"),
    (["compile-rows", "--tokens", "0"], "--tokens: must be an integer >= 1, got '0'"),
    (["evaluate-demo", "--out", "grid.txt"], "--out must be an image file"),
    (["evaluate-demo", "--samples", "0"], "--samples: must be an integer >= 1"),
    (["gpu-check", "--samples", "0"], "--samples: must be an integer >= 1"),
    (["calibrate-regime", "flat"], "invalid choice: 'flat'"),
    (["real-size", "--precisions", "fp8"], "argument --precisions: invalid choice: 'fp8'"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_give_one_error_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_one_error_line(tooling.main, argv, message, capsys, tmp_path)


def test_real_process_error_is_one_line():
    code, out, err = run_tooling("gpu-check", "--dry-run", "--stage-budget", "warp=3")
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
