"""The user's commands, `python -m specar <command>`, one module per command (the list: docs/ARCHITECTURE.md's table;
the maintainers' commands are tooling/'s); args.py: how a command is declared, parsed and run (one-line errors, exit
code 2); model_spec.py, machine.py: model specs (`tiny:...`) and the machine a run records, shared with tooling/."""
from .args import Commands

COMMANDS = Commands("python -m specar", __package__, {
    "demo": "demo", "bench": "bench", "train-drafter": "train_drafter",
    "convert-checkpoint": "convert_checkpoint", "convert-drafter": "convert_drafter",
}, "SpecAR: lossless speculative decoding for autoregressive image models.")
main, call, parser = COMMANDS.main, COMMANDS.call, COMMANDS.parser

__all__ = ["COMMANDS", "call", "main", "parser"]
