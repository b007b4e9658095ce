"""`python -m specar <command>`: the user's commands (cli/; `python -m specar --help` lists them). The maintainers'
commands are `python -m specar.tooling <command>` (a checkout's tooling/, not in the wheel: the product never
imports it)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
