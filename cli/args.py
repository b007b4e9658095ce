"""Argument parsing shared by the commands of `python -m specar`: a parser whose errors are one
`error: ...` line (exit code 2), whose help shows every default, and checked numeric types."""
from __future__ import annotations

import argparse
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


def command_parser(command: str, doc: str) -> CommandParser:
    """The parser of `python -m specar <command>`: the module docstring as its whole description."""
    return CommandParser(prog=f"python -m specar {command}", description=doc.strip())


def parse_command(command: str, doc: str, add_arguments, argv=None) -> argparse.Namespace:
    """A command's arguments, parsed by its own `add_arguments` (for its `main(argv)`)."""
    ap = command_parser(command, doc)
    add_arguments(ap)
    return ap.parse_args(argv)


__all__ = ["parse_command", "CommandParser", "HelpFormatter", "command_parser", "non_negative_float", "non_negative_int",
           "positive_float", "positive_int"]
