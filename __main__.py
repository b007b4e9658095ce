"""`python -m specar <command>`: the user's commands (cli/; `python -m specar --help` lists them). A maintainer's
command (tooling/, `python -m specar.tooling --help` lists them) is passed on to tooling/, unlisted here."""
import sys

from .cli import COMMANDS

try:  # the maintainers' tooling is in a checkout, not in the wheel
    from .tooling import COMMANDS as TOOLING
except ModuleNotFoundError as e:
    if e.name != f"{__package__}.tooling":
        raise
    TOOLING = ()


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    return (TOOLING if command in TOOLING else COMMANDS).main(argv)


if __name__ == "__main__":
    sys.exit(main())
