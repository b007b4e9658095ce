"""The command-line tools of `python -m specar <command>` (one module per command) and the dispatcher:

- demo.py: `demo` (make demo): the demo model, AR vs the default backend
- benchmark.py: `bench` (make bench): every backend side by side in one run
- regimes.py: the bench's regimes (`bench --regime demo|paper|flat`); calibrate_regime.py: `calibrate-regime` (the paper
  regime's temperature)
- shape_bench.py: `shape-bench`: 7B-shape forward latency vs the sampling core's cost
- compile_rows.py: `compile-rows`: the compiled CPU step's limit for products as a multiply-and-sum
- roofline.py: `shape-bench --roofline`: the GPU latency projection (a roofline model, labelled a projection)
- real_size.py: `real-size`: every family at a released checkpoint's widths: memory and forward time
- evaluate_demo.py: `evaluate-demo`: prompt following of the demo model (16 judged prompts)
- train_drafter.py: `train-drafter`: Hawk heads / EAGLE drafter by self-distillation
- convert_checkpoint.py, convert_drafter.py: released checkpoints and drafters -> our files
- args.py: the parser every command uses (one-line errors, defaults in the help, checked numbers)

Errors: a bad argument or a failure prints one `error: ...` line and exits with code 2; `--debug`
(anywhere on the command line) shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .args import CommandParser, HelpFormatter

# command -> (module in cli/, one-line summary for `python -m specar --help`)
COMMANDS = {
    "demo": ("demo", "generate images with the embedded demo model: plain AR and the default backend, "
                     "speed-up measured in the same run (what `make demo` runs)"),
    "bench": ("benchmark", "every backend side by side on the same prompts and seeds, one run (`make bench`)"),
    "calibrate-regime": ("calibrate_regime", "the `paper` bench regime's temperature: where SJD's paper setting commits what "
                                    "SJD commits on Lumina-mGPT (writes cli/regime_paper.json)"),
    "shape-bench": ("shape_bench", "forward latency of a 7B model's shape vs the sampling core's cost per step"),
    "compile-rows": ("compile_rows", "the compiled CPU step: matrix products by BLAS vs as a multiply-and-sum, by "
                                     "rows (sets few_rows_matmul.MAX_ROWS)"),
    "gpu-check": ("gpu_check", "the CUDA path in one command, each stage isolated: exactness on the device, every "
                               "backend eager vs compiled, 7B-shape forwards, the roofline refit (--dry-run: CPU)"),
    "evaluate-demo": ("evaluate_demo", "prompt following of the demo model: 16 prompts judged automatically"),
    "train-drafter": ("train_drafter", "train Hawk heads or an EAGLE drafter on a frozen model by self-distillation"),
    "real-size": ("real_size", "each family at a released checkpoint's real widths (random weights): load, a few "
                               "speculative steps, VQ decode, peak memory and ms per forward, bf16 / int8 / int4"),
    "convert-checkpoint": ("convert_checkpoint", "a released .pt/.ckpt checkpoint -> safetensors"),
    "convert-drafter": ("convert_drafter", "a released drafter (LANTERN) -> SpecAR's drafter files"),
}
# commands whose parser lives in their own module's main(argv): the arguments are passed on unparsed
PASS_THROUGH = {"bench", "calibrate-regime", "convert-checkpoint", "convert-drafter"}


def version() -> str:
    from .. import __version__
    return __version__


ALL = "*"


def parser(command: str = ALL) -> CommandParser:
    """The parser of `python -m specar`: every command's options (ALL), or only `command`'s (None: none),
    the others listed by their summary, since their modules import torch: `--help` and `--version` must
    not wait for it."""
    ap = CommandParser(prog="python -m specar", description=(
        "SpecAR: lossless speculative decoding for autoregressive image models.\n\n"
        "Run `python -m specar <command> --help` for a command's options. Errors are one `error:` line "
        "(exit code 2); add --debug anywhere to see the traceback instead."))
    ap.add_argument("--version", action="version", version=f"specar {version()}")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = ap.add_subparsers(dest="command", metavar="<command>", parser_class=CommandParser)
    for name, (module, summary) in COMMANDS.items():
        if name in PASS_THROUGH or command not in (ALL, name):
            sub.add_parser(name, help=summary, add_help=False)
            continue
        mod = importlib.import_module(f".{module}", __package__)
        cmd = sub.add_parser(name, help=summary, description=(mod.__doc__ or summary).strip(),
                             formatter_class=HelpFormatter)
        mod.add_arguments(cmd)
        cmd.set_defaults(run=mod.run)
    return ap


def _dispatch(argv: list) -> int:
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in PASS_THROUGH and argv[0] == command:
        module = importlib.import_module(f".{COMMANDS[command][0]}", __package__)
        module.main(argv[1:])
        return 0
    ap = parser(command)
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help(sys.stderr)
        ap.error("no command given: choose one of " + ", ".join(COMMANDS))
    args.run(args)
    return 0


def main(argv=None) -> int:
    """`python -m specar`: returns the exit code (0, or 2 after one `error:` line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        return _dispatch(argv)
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


__all__ = ["COMMANDS", "main", "parser"]
