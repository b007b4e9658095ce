"""Build the tiny Janus-Pro, Emu3 and Chameleon (Lumina-mGPT / Anole) test folders in the on-disk format
of the released checkpoints, for `make test-floor` (tests/test_transformers_floor.py loads them with the
oldest transformers we support).

The folders are written with the test suite's builders (current transformers), then given what the
released checkpoints have and transformers 5 no longer writes: a tokenizer_config.json naming
PreTrainedTokenizerFast with the model's extra special tokens as a dict, and Janus's lm_head tensor.

    python tests/support/floor_models.py OUT_DIR
"""
import importlib.util
import json
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the builders live in the tests
FAMILIES = {"janus": ("test_janus", "build_tiny_janus"), "emu3": ("test_emu3", "build_tiny_emu3"),
            "chameleon": ("test_chameleon", "build_tiny_chameleon")}
EXTRA_TOKENS = ("boi_token", "eoi_token", "image_token", "eof_token", "image_wrapper_token")


def _builder(module, fn):
    if TESTS not in sys.path:  # the builders' modules import the tests' own support package
        sys.path.insert(0, TESTS)
    spec = importlib.util.spec_from_file_location(module, os.path.join(TESTS, f"{module}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def released_format(folder: str) -> None:
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["extra_special_tokens"] = {k: cfg[k] for k in EXTRA_TOKENS if k in cfg}
    cfg.pop("backend", None)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    weights = os.path.join(folder, "model.safetensors")
    from safetensors.torch import load_file, save_file
    state = load_file(weights)
    embed = [k for k in state if k.endswith("language_model.embed_tokens.weight")]
    if embed and "lm_head.weight" not in state:  # Janus: released checkpoints store the (tied) text head
        state["lm_head.weight"] = state[embed[0]].clone()
        save_file(state, weights, metadata={"format": "pt"})


def main(out: str) -> None:
    for family, (module, fn) in FAMILIES.items():
        folder = os.path.join(out, family)
        _builder(module, fn)(folder)
        released_format(folder)
        print(folder)


if __name__ == "__main__":
    main(sys.argv[1])
