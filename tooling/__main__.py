"""`python -m specar.tooling <command>`: the maintainers' commands (`--help` lists them)."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
