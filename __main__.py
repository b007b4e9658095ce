"""`python -m specar <command>`: demo (make demo), bench (backends side by side), shape-bench (7B-shape
forward vs sampling core), evaluate-demo (prompt following of the demo model), train-drafter (Hawk heads /
EAGLE drafter), convert-checkpoint (a .pt/.ckpt loaded with weights_only=True -> safetensors), convert-drafter
(LANTERN's released EAGLE drafters -> our drafter files). Commands live in cli/."""
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"demo": "demo", "bench": "benchmark", "shape-bench": "shape_bench", "evaluate-demo": "evaluate_demo",
                "train-drafter": "train_drafter", "convert-checkpoint": "convert_checkpoint",
                "convert-drafter": "convert_drafter"}
    if not argv or argv[0] not in commands:
        print(f"usage: python -m specar {{{','.join(commands)}}} [options]  (add -h for a command's options)")
        return 2
    import importlib
    module = importlib.import_module(f".cli.{commands[argv[0]]}", __package__)
    module.main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
