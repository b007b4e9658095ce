"""Every per-backend table is derived from the registry (`samplers/backends.py` METHODS / SCHEMAS and each
method's declarations): a throwaway 9th backend, a package of its own in a temporary folder registered by one line,
appears in the command line's choices, the sampler node's inputs and essentials, the web extension's data and the
bench's default run, with no other file changed; importing the registry imports no
torch (the command line checks its arguments with it before torch loads)."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from specar.cli import benchmark, main, schema
from specar.nodes import spec, v1
from specar.samplers import backends
import torch

import specar
from specar.model_loaders.tiny import tiny_model
from support import PACKAGE as ROOT

THROWAWAY_PACKAGE = {  # the 9th backend's package: its Method (no torch), its drafter (imported on first use)
    "__init__.py": """
        from dataclasses import dataclass

        from specar.samplers.drafters.params import Method, param


        @dataclass(frozen=True)
        class ThrowawayParams:
            window: int = param(4, "drafts per forward", lo=1, hi=8, sizes=True, essential=True)
            mode: str = param("plain", "how candidates are chosen", choices=("plain", "tree"), essential=True,
                              implies={"tree": {"shape": "wide"}})
            shape: str = param("narrow", "the tree's shape", choices=("narrow", "wide"))
            strength: float = param(0.5, "a knob nobody needs first", lo=0.0, hi=1.0)


        THROWAWAY = Method("throwaway", "Throwaway", "a 9th backend that exists only in this test", ThrowawayParams,
                           "throwaway_backend.drafter:ThrowawayDrafter",
                           bench_variants=("window=8,mode=tree,shape=wide",))
        """,
    "drafter.py": """
        import torch

        from specar.samplers.drafters.base import Drafter
        from specar.samplers.proposal import DraftTree, one_hot


        class ThrowawayDrafter(Drafter):
            # the least a drafter can be: `window` copies of the pending token as a chain (q one-hot), no state

            def __init__(self, params, model, sampling):
                self.node_budget, self.slack = params.window + 1, params.window + 2

            def propose(self, state, plan) -> DraftTree:
                B, N = state.ctx.batch, self.node_budget
                pending = state.seq.gather(1, state.frontier[:, None]).clamp(max=state.ctx.vocab_size - 1)
                tokens = pending.expand(B, N)
                return DraftTree(tokens=tokens, parents=[-1] + list(range(N - 1)),
                                 q=one_hot(tokens, state.ctx.vocab_size),
                                 valid=torch.ones(B, N, dtype=torch.bool, device=state.ctx.device),
                                 depth=torch.arange(N, device=state.ctx.device), max_children=1, max_depth=N - 1)
        """,
}


@pytest.fixture
def ninth_backend(tmp_path):
    """The registry with the temporary package's THROWAWAY added (its one line: METHODS and what derives from it,
    patched and restored), and the modules that read it at import time reloaded inside and after."""
    assert len(backends.METHODS) == 8
    package = tmp_path / "throwaway_backend"
    package.mkdir()
    for name, text in THROWAWAY_PACKAGE.items():
        (package / name).write_text(textwrap.dedent(text))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        throwaway = importlib.import_module("throwaway_backend").THROWAWAY
        assert "throwaway_backend.drafter" not in sys.modules  # declared without its drafter
        mp.setattr(backends, "METHODS", backends.METHODS + (throwaway,))  # the registry line
        mp.setitem(backends.SCHEMAS, throwaway.name, throwaway)
        mp.setattr(backends, "BACKENDS", tuple(backends.SCHEMAS))
        importlib.reload(benchmark)
        yield throwaway
        for name in ("throwaway_backend", "throwaway_backend.drafter"):
            sys.modules.pop(name, None)
    importlib.reload(benchmark)
    assert "throwaway" not in backends.SCHEMAS and not any("throwaway" in c for c in benchmark.DEFAULT_CONFIGS)


def test_importing_the_registry_imports_no_torch():
    code = ("import sys; from specar.samplers import backends; backends.make_backend('auto', max_window=8); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


def test_a_ninth_backend_is_a_choice_of_the_command_line(ninth_backend, capsys):
    assert main(["bench", "--help"]) == 0
    assert "throwaway" in " ".join(capsys.readouterr().out.split()).split("backends: ")[1].split(";")[0]
    assert schema.parse_config("throwaway:window=8,mode=tree") == {"backend": "throwaway", "window": 8, "mode": "tree"}
    with pytest.raises(ValueError, match=r"window must be an int in \[1, 8\], got 9 \(in 'throwaway:window=9'\)"):
        schema.parse_config("throwaway:window=9")
    assert "throwaway_backend.drafter" not in sys.modules  # checked, not yet run: its drafter is not imported


def test_a_ninth_backend_reaches_nodes_web_and_bench(ninth_backend):
    # nodes: its inputs, its essentials first, the implied choice for the web extension
    req = v1.input_types(spec.sampler_spec())["required"]
    assert "throwaway" in req["backend"][0] and req["backend"][1]["specar_labels"]["throwaway"] == "Throwaway"
    assert [spec.is_advanced("throwaway", p) for p in ("window", "mode", "shape", "strength")] == [
        False, False, True, True]
    assert req["throwaway_shape"][1].get("specar_advanced") and not req["throwaway_window"][1].get("specar_advanced")
    assert req["throwaway_mode"][1]["specar_implies"] == {"tree": {"shape": "wide"}}
    assert req["throwaway_window"][1]["default"] == 4
    # the bench's default run carries its defaults and the variant it declares, and parses them
    assert benchmark.DEFAULT_CONFIGS[-2:] == ["throwaway", "throwaway:window=8,mode=tree,shape=wide"]
    assert benchmark.parse_config(benchmark.DEFAULT_CONFIGS[-1]) == {
        "backend": "throwaway", "window": 8, "mode": "tree", "shape": "wide"}
    # validation and the typed parameters
    assert backends.make_backend("throwaway", window=3).typed_params == ninth_backend.params_type(window=3)


def test_a_ninth_backend_generates(ninth_backend):
    """Registered by one line, it runs through the engine and the one verification: AR's image in the same-image
    mode, and in its own draws an image of the model's codes in fewer forwards than AR on a repetitive target."""
    model = tiny_model(vocab_size=4, grid=(4, 4), seed=3, logit_scale=8.0)
    ar = specar.generate(model, "hi", backend="ar", seed=5, batch_size=3)
    same = specar.generate(model, "hi", backend=specar.make_backend("throwaway", window=3), seed=5, batch_size=3)
    assert torch.equal(same.tokens, ar.tokens) and same.stats.backend == "throwaway"
    own = specar.generate(model, "hi", backend=specar.make_backend("throwaway", window=3), seed=5, batch_size=3,
                          options=dict(reproducible=False))
    assert own.tokens.shape == ar.tokens.shape and int(own.tokens.max()) < 4
    assert same.stats.nfe <= ar.stats.nfe and own.stats.nfe <= ar.stats.nfe


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_the_web_extension_reads_implied_choices_from_the_node_definition(ninth_backend, tmp_path):
    """specar.js holds no table of backends: the implied choice of the 9th backend comes from the node's
    definition, and choosing it sets the other input (flat layout)."""
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text("export const app = { registerExtension(e) {} };\n")
    ext = tmp_path / "extensions" / "specar"
    ext.mkdir(parents=True)
    for name in os.listdir(os.path.join(ROOT, "web")):
        shutil.copy(os.path.join(ROOT, "web", name), ext / name)
    inputs = v1.input_types(spec.sampler_spec())
    (tmp_path / "def.json").write_text(json.dumps({"name": "SpecARSampler", "input": inputs}))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
const m = await import("./extensions/specar/specar.js");
const def = JSON.parse(readFileSync("def.json", "utf8"));
const implied = m.impliedChoices(def);
const keys = def.input.required.backend[0];
const widgets = ["backend", "throwaway_mode", "throwaway_shape", "adt_tree_tree_shape", "adt_tree_candidate_mode"]
  .map((name) => ({ name, value: def.input.required[name]?.[1]?.default, callback: null }));
const node = { widgets };
const w = (n) => widgets.find((x) => x.name === n);
w("backend").value = "throwaway";
m.hookImplied(node, implied, keys);
w("throwaway_mode").value = "tree"; w("throwaway_mode").callback("tree");
console.log(JSON.stringify({ implied, shape: w("throwaway_shape").value,
  adtHooked: !!w("adt_tree_tree_shape").specarImplied }));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["implied"]["throwaway_mode"] == {"implies": {"tree": {"shape": "wide"}}, "lossy": False}
    assert res["implied"]["adt_tree_tree_shape"] == {"implies": {"best_first": {"candidate_mode": "sampled"}},
                                                     "lossy": False}
    assert res["shape"] == "wide" and res["adtHooked"] is False  # only the chosen backend's inputs are hooked


def test_every_backend_has_a_few_essential_inputs():
    for name, method in backends.SCHEMAS.items():
        names = [p.name for p in method.params]
        essential = [n for n in names if not spec.is_advanced(name, n)]
        assert essential == list(method.essential_params)
        assert essential or not names, name  # AR has no inputs
        if len(names) > 1:
            assert len(essential) < len(names), (name, essential)


def test_implied_choices_name_real_parameters_and_values_their_backend_accepts():
    for name, method in backends.SCHEMAS.items():
        for p in method.params:
            for value, forced in p.implies:
                assert p.check(value) == value, (name, p.name)
                for other, forced_value in forced:
                    assert method.param(other).check(forced_value) == forced_value, (name, p.name, other)
                    backends.make_backend(name, **{p.name: value, other: forced_value})  # a combination it accepts


def test_experimental_backends_are_last_labelled_and_out_of_the_bench_default_run():
    experimental = [m.experimental for m in backends.SCHEMAS.values()]
    assert any(experimental) and experimental == sorted(experimental), experimental  # the node lists them last
    for name, method in backends.SCHEMAS.items():
        assert (name in benchmark.DEFAULT_CONFIGS) != method.experimental, name
        assert ("experimental" in method.label.lower()) == method.experimental, method.label
        assert benchmark.parse_config(name)  # still run when named: `bench --backends spatial`
