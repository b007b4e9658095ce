"""The web extension (web/specar.js, run with node as the frontend loads it) greys out the backend parameters that
have no effect with same_image_as_ar on (the coupling of SCD, SJD-PAC and Spatial), from the flag the node
definition carries. The browser check (tooling/ui_check.js, make test-ui) runs the same code in ComfyUI's own frontends."""
import json
import shutil
import subprocess

import pytest

from specar.nodes import spec, v1
from support.node_harness import web_extension_folder


def test_the_node_definition_flags_exactly_the_moot_parameters():
    types = v1.SpecARSampler.INPUT_TYPES()
    flagged = {n for n, (kind, opts) in {**types["required"], **types.get("optional", {})}.items()
               if isinstance(opts, dict) and opts.get("specar_moot_when_same_image")}
    assert flagged
    assert all(any(n.endswith("_" + p) for p in spec.MOOT_WHEN_SAME_IMAGE) for n in flagged)
    assert {"scd_coupling", "scd_coupling_strength"} <= flagged


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_the_coupling_inputs_are_greyed_out_while_same_image_as_ar_is_on(tmp_path, comfy):
    web_extension_folder(tmp_path)
    types = v1.SpecARSampler.INPUT_TYPES()
    (tmp_path / "node_def.json").write_text(json.dumps({"name": "SpecARSampler", "input": types}))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
await import("./extensions/specar/specar.js");
const def = JSON.parse(readFileSync("node_def.json", "utf8"));
function NodeType() {}
await globalThis.registered.beforeRegisterNodeDef(NodeType, def);
const node = new NodeType();
node.size = [300, 900];
node.widgets = Object.entries({ ...def.input.required, ...def.input.optional }).filter(([n, [k]]) => k !== "SPECAR_MODEL")
  .map(([name, [kind, opts]]) => ({ name, type: Array.isArray(kind) ? "combo" : kind, value: opts.default, callback: null }));
node.computeSize = () => [300, 900];
node.setSize = (s) => { node.size = s; };
node.addWidget = (type, name, value, callback) => { const x = { type, name, value, callback }; node.widgets.push(x); return x; };
node.onNodeCreated();
const w = (n) => node.widgets.find((x) => x.name === n);
const pick = (n, v) => { w(n).value = v; w(n).callback(v); };
const seen = {};
pick("backend", "scd"); pick("same_image_as_ar", true);
seen.on = [w("scd_coupling").disabled, w("scd_coupling_strength").disabled, !!w("scd_window").disabled];
pick("same_image_as_ar", false);
seen.off = [w("scd_coupling").disabled, w("scd_coupling_strength").disabled];
console.log(JSON.stringify(seen));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["on"] == [True, True, False]  # only the coupling: the window still acts
    assert seen["off"] == [False, False]
