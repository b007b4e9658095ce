"""The user's commands, `python -m specar <command>`, one module per command (the maintainers' commands are
tooling/'s, `python -m specar.tooling`):

- demo.py: `demo` (make demo): the demo model, AR vs the default backend (auto)
- bench.py: `bench` (make bench): every backend side by side in one run; benchmark.py (its configurations, its
  measurement and its table), regimes.py (`bench --regime`)
- train_drafter.py: `train-drafter`; convert_checkpoint.py, convert_drafter.py: released files -> ours
- model_spec.py, machine.py: model specs (`tiny:...`) and the machine a run records, shared with tooling/
- args.py: how a command is declared, parsed and run (one-line errors, exit code 2)
"""
from .args import Commands

COMMANDS = Commands("python -m specar", __package__, {
    "demo": "demo", "bench": "bench", "train-drafter": "train_drafter",
    "convert-checkpoint": "convert_checkpoint", "convert-drafter": "convert_drafter",
}, "SpecAR: lossless speculative decoding for autoregressive image models.")
main, call, parser = COMMANDS.main, COMMANDS.call, COMMANDS.parser

__all__ = ["COMMANDS", "call", "main", "parser"]
