"""The one way a command is declared, parsed and run, for `python -m specar` (cli/) and `python -m specar.tooling`
(tooling/). A command is a module whose docstring opens with "`python -m <prog> <name>`: <summary>." and that
defines `add_arguments(parser)` and `run(args)`; a `Commands` table names the modules. Errors are one
`error: ...` line (exit code 2); `--debug` (anywhere) shows the traceback instead; help shows every default."""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written (whole paragraphs, never cut), every option's default shown
    (options without a value to default to, None or a flag, show none)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: `error: <what>; see <prog> --help`, exit code 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def _number(kind, name: str, lo, inclusive: bool):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {name}, got {text!r}") from None
        if value != value or (value < lo if inclusive else value <= lo):  # NaN, or below the bound
            raise argparse.ArgumentTypeError(f"must be {name}, got {text!r}")
        return value

    parse.__name__ = name  # argparse names the type in its messages
    return parse


positive_int = _number(int, "an integer >= 1", 1, True)
non_negative_int = _number(int, "an integer >= 0", 0, True)
positive_float = _number(float, "a number > 0", 0.0, False)
non_negative_float = _number(float, "a number >= 0", 0.0, True)


def summary(doc: str) -> str:
    """A command's one-line summary: its docstring's first paragraph after the "`python -m ... name`: " opening."""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first.split("`: ", 1)[1] if first.startswith("`") and "`: " in first else first


class Commands:
    """The commands of one program: name -> module (relative to `package`). Only the command being run is
    imported (the modules import torch: `--help` and `--version` must not wait for it); the others are
    listed by the summary read from their source."""

    def __init__(self, prog: str, package: str, modules: dict, title: str):
        self.prog, self.package, self.modules = prog, package, dict(modules)
        self.description = (f"{title}\n\nRun `{prog} <command> --help` for a command's options. Errors are one "
                            "`error:` line (exit code 2); add --debug anywhere to see the traceback instead.")

    def __iter__(self):
        return iter(self.modules)

    def __contains__(self, name) -> bool:
        return name in self.modules

    def module(self, name: str):
        return importlib.import_module(f".{self.modules[name]}", self.package)

    def doc(self, name: str) -> str:
        """The command module's docstring, read from its source without importing it."""
        spec = importlib.util.find_spec(f".{self.modules[name]}", self.package)
        with open(spec.origin, encoding="utf-8") as f:
            return ast.get_docstring(ast.parse(f.read())) or ""

    def parser(self, command=None) -> CommandParser:
        """The program's parser: `command`'s options (its module imported), the other commands by their summary."""
        from .. import __version__
        ap = CommandParser(prog=self.prog, description=self.description)
        ap.add_argument("--version", action="version", version=f"specar {__version__}")
        ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
        sub = ap.add_subparsers(dest="command", metavar="<command>", parser_class=CommandParser)
        for name in self.modules:
            if name != command:
                sub.add_parser(name, help=summary(self.doc(name)), add_help=False)
                continue
            mod = self.module(name)
            cmd = sub.add_parser(name, help=summary(mod.__doc__), description=mod.__doc__.strip(),
                                 formatter_class=HelpFormatter)
            mod.add_arguments(cmd)
            cmd.set_defaults(run=mod.run)
        return ap

    def call(self, argv: list):
        """Parse `argv` (the command first) and run the command: its return value; errors raise."""
        command = next((a for a in argv if not a.startswith("-")), None)
        ap = self.parser(command)
        args = ap.parse_args(argv)
        if args.command is None:
            ap.print_help(sys.stderr)
            ap.error("no command given: choose one of " + ", ".join(self.modules))
        args.command_line = " ".join([self.prog, *argv])  # what a command records as its own command
        return args.run(args)

    def main(self, argv=None) -> int:
        """Run the command line: the exit code (0, or 2 after one `error:` line)."""
        argv = list(sys.argv[1:] if argv is None else argv)
        debug = "--debug" in argv
        argv = [a for a in argv if a != "--debug"]
        try:
            self.call(argv)
            return 0
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            return 130
        except SystemExit as e:  # argparse (help, version, usage errors) and commands that exit themselves
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        except Exception as e:
            if debug:
                raise
            what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            sys.stderr.write(f"error: {what} (--debug shows the traceback)\n")
            return 2
