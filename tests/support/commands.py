"""What every command of a `Commands` program is held to (the user's, tests/test_cli.py, and the maintainers',
tooling/tests/test_tooling_cli.py): its help whole with the code's defaults, a bad argument one `error:` line."""
import os
import re
import subprocess
import sys

import pytest

from specar.cli.args import summary

from . import SPECAR_PARENT


def run_module(module: str, *args):
    """`python -m MODULE ARGS` in a fresh interpreter, on the `specar` the tests import (one thread): (exit code,
    stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=SPECAR_PARENT,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SPECAR_PARENT}, timeout=300)
    return p.returncode, p.stdout, p.stderr


def listed(help_text: str) -> list:
    """The commands a program's --help lists (its `<command>` block)."""
    return re.findall(r"^    (\S+)", help_text.split("<command>\n", 1)[1].split("\noptions:")[0], re.M)


def check_command_help(program, command: str, capsys) -> None:
    """The command's docstring opens with its command line and a summary (the program's --help lists it); its
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


def check_one_error_line(main, argv: list, message: str, capsys, tmp_path) -> None:
    """`main(argv)` (argv's OUT: a path under tmp_path) exits 2 with one `error:` line holding `message`, no
    traceback, and writes nothing."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing was trained or written
