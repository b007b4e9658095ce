"""`python -m specar <command>`: demo, bench, shape-bench, evaluate-demo, train-drafter, convert-checkpoint,
convert-drafter (`python -m specar --help` lists them). The commands and the dispatcher live in cli/."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
