"""The web extension (web/specar.js, run with node when installed) and, opt-in, a real ComfyUI: set
SPECAR_COMFYUI to a ComfyUI checkout (and SPECAR_COMFYUI_PYTHON to its Python, if not this one) for the
server test (the frontend test, driven by the maintainers' tooling/screenshot_nodes.py: tooling/tests/).
The nodes run without ComfyUI: stand-ins from tests/support/comfy_stubs.py through the `comfy` fixture (tests/conftest.py).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from specar.nodes import core, layouts, spec, v1
from specar.samplers.backends import SCHEMAS
from support.node_harness import (
    ROOT, EXAMPLES, param_names, execute, load_json, BASE, stop_process, api_twin, sampler_values, web_extension_folder)


@pytest.mark.skipif(not os.environ.get("SPECAR_COMFYUI"), reason="set SPECAR_COMFYUI to a ComfyUI checkout")
def test_real_comfyui_server(tmp_path):
    import socket
    import time
    import urllib.error
    import urllib.request

    comfy_dir = os.environ["SPECAR_COMFYUI"]
    python = os.environ.get("SPECAR_COMFYUI_PYTHON", sys.executable)
    nodes_dir = tmp_path / "custom_nodes"
    nodes_dir.mkdir()
    os.symlink(ROOT, nodes_dir / "specar")
    config = tmp_path / "extra_model_paths.yaml"
    config.write_text(f"specar_test:\n  base_path: {tmp_path}\n  custom_nodes: custom_nodes\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--extra-model-paths-config", str(config), "--disable-auto-launch",
                             "--output-directory", str(tmp_path / "output"), "--temp-directory", str(tmp_path)],
                            cwd=comfy_dir, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})

    def get(path):
        with urllib.request.urlopen(url + path, timeout=10) as r:
            return json.loads(r.read())

    try:
        deadline = time.time() + 180
        while True:
            try:
                info = get("/object_info")
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "server.log").read_text()[-4000:]
                time.sleep(1)
        assert {"SpecARModelLoader", "SpecARSampler", "SpecARDecode"} <= set(info), \
            (tmp_path / "server.log").read_text()[-4000:]
        assert info["SpecARSampler"]["category"] == "SpecAR"
        prompt = load_json(api_twin("SpecAR demo - auto.json", info))
        bad = json.loads(json.dumps(prompt))
        bad["10"]["inputs"]["backend"] = "turbo"
        req = urllib.request.Request(url + "/prompt", data=json.dumps({"prompt": bad}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:  # rejected by the node's own validation
            urllib.request.urlopen(req, timeout=30)
        assert "backend must be one of" in e.value.read().decode()
        req = urllib.request.Request(url + "/prompt", data=json.dumps({"prompt": prompt, "client_id": "t"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            prompt_id = json.loads(r.read())["prompt_id"]
        deadline = time.time() + 300
        while True:
            hist = get(f"/history/{prompt_id}")
            if prompt_id in hist:
                break
            assert proc.poll() is None and time.time() < deadline
            time.sleep(1)
        entry = hist[prompt_id]
        assert entry["status"]["status_str"] == "success", entry["status"]
        out = entry["outputs"]
        stats = json.loads(out["10"]["specar_stats"][0])
        label = SCHEMAS[prompt["10"]["inputs"]["backend"]].label  # the demo's backend, e.g. "SJD-PAC"
        assert stats["backend_label"] == label and out["10"]["text"][0].startswith(label) and stats["nfe"] >= 1
        assert out["20"]["images"] and out["30"]["images"]  # the image and the heatmap previews
    finally:
        stop_process(proc)
        log.close()


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_renders_stats_and_follows_the_execution_to_its_end(tmp_path, comfy):
    web_extension_folder(tmp_path)
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    _, ui = execute(v1.SpecARSampler, model=model, **{**BASE, "backend": "sjd_pac"})
    (tmp_path / "message.json").write_text(json.dumps(ui))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
await import("./extensions/specar/specar.js");
const ext = globalThis.registered;
const listeners = {};
globalThis.api.addEventListener = (kind, fn) => { listeners[kind] = fn; };
await ext.setup();
const fire = (kind, detail) => listeners[kind]({ detail });
function NodeType() {}
NodeType.prototype.onExecuted = function () { this.calledOriginal = true; };
await ext.beforeRegisterNodeDef(NodeType, { name: "SpecARSampler" });
const other = function () {};
await ext.beforeRegisterNodeDef(other, { name: "KSampler" });
const node = new NodeType();
Object.assign(node, {
  id: 10, widgets: [{ name: "backend", value: "sjd_pac" }], size: [300, 200],
  addWidget(type, name, value, cb, options) { const w = { type, name, value, options, callback: cb }; this.widgets.push(w); return w; },
  computeSize() { return [320, 260]; },
  setSize(s) { this.size = s; },
  setDirtyCanvas() {},
});
node.onNodeCreated();
const box = () => node.widgets.find((w) => w.name === "specar_stats_view").value;
const seen = { idle: box() };
const message = JSON.parse(readFileSync("message.json", "utf8"));
node.onExecuted(message);
node.onExecuted(message);
seen.folded = box();
const details = node.widgets.find((w) => w.name === "statistics details");
details.value = true; details.callback(true);
seen.unfolded = box();
details.value = false; details.callback(false);
// a cancelled run: waiting, running, a compile stage, cancelled
node.onExecutionStart(); seen.waiting = box();
fire("executing", "10"); seen.running = box();
fire("specar_stage", { node: "10", text: "compiling the decode step..." }); seen.stage = box();
fire("specar_stage", { node: "10", text: null }); seen.afterStage = box();
fire("execution_interrupted", { node_id: "10" }); seen.cancelled = box();
fire("executing", null); seen.cancelledAfterEnd = box();
// another node fails before this one runs; then this node fails itself
node.imgs = ["an earlier run's preview"];
node.onExecutionStart(); fire("execution_error", { node_id: "3", node_type: "SpecARModelLoader", exception_message: "no CUDA GPU\\nmore" });
seen.upstream = box(); seen.upstreamImgs = node.imgs ?? null;
node.onExecutionStart(); fire("executing", { node: "10" }); fire("execution_error", { node_id: "10", exception_message: "out of GPU memory" });
seen.failed = box();
// nothing changed: ComfyUI reused the cached result and ran nothing; the last statistics come back
node.onExecuted(message);
node.onExecutionStart(); fire("executing", null); seen.cached = box();
node.onExecutionStart(); fire("execution_success", {}); seen.cachedSuccess = box();
// a run of another node's that ended does not touch a finished node
fire("execution_interrupted", { node_id: "3" }); seen.untouched = box();
// another backend: the last run's statistics are not its own
const backend = node.widgets.find((w) => w.name === "backend");
backend.value = "hawk"; backend.callback?.("hawk"); seen.switched = box();
console.log(JSON.stringify({ seen, original: node.calledOriginal, size: node.size,
                             other: other.prototype.onExecuted === undefined,
                             serialize: node.widgets.filter((w) => w.name !== "backend").map((w) => w.serialize) }));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    seen = res["seen"]
    assert res["original"] and res["other"] and res["size"] == [320, 260]
    assert set(res["serialize"]) == {False}  # the box and the toggles are display only
    summary = ui["text"][0].split("\n")[0]
    assert seen["idle"] == "statistics appear here after a run"
    # one summary line, the details folded behind the toggle
    assert seen["folded"] == summary + '\n(more: turn on "statistics details")'
    assert summary.startswith("SJD-PAC: 16 tokens in") and "same image as AR" in summary
    details = seen["unfolded"].split("\n")[1:]
    assert seen["unfolded"].startswith(summary) and "same_image_as_ar on" in details
    assert any(d.startswith("backend SJD-PAC (window=") for d in details)
    assert any(d.startswith("sampling: cfg") for d in details) and any("tokens per forward" in d for d in details)
    # the preview is sent upscaled (the frontend labels it 512x512): the statistics say the image's own size
    assert "image 4x4 px; live preview: the 4x4 image, shown upscaled to 512x512" in details
    assert (seen["waiting"], seen["running"]) == ("waiting to run...", "running...")
    assert seen["stage"] == "compiling the decode step..." and seen["afterStage"] == "running..."
    # the partial preview is drawn below the box (the browser check, tooling/ui_check.js, sees where)
    assert seen["cancelled"].startswith("cancelled: the image below is the partial") == seen["cancelledAfterEnd"].startswith("cancelled")
    assert seen["upstream"] == "not run: SpecARModelLoader (node 3) failed first: no CUDA GPU"
    assert seen["upstreamImgs"] is None  # the earlier run's preview is gone from a node that did not run
    assert seen["failed"] == "failed: out of GPU memory"
    assert seen["cached"] == seen["cachedSuccess"] == seen["untouched"] == seen["folded"]
    assert seen["switched"] == "statistics appear here after a run"


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_moves_the_old_sentinels_into_the_sampling_switch(tmp_path):
    """Values saved before the sampling switch (temperature -1 and top_p 0: the model's own values) load into it:
    "model default", or "custom" with the values that were set (planted: the sentinels shown as -1.00 and 0.00)."""
    web_extension_folder(tmp_path)
    saved = [{"temperature": -1, "top_p": 0, "seed": 3}, {"temperature": 0.7, "top_p": 0.9},
             {"temperature": -1, "top_p": 0.8}, {"sampling": "custom", "temperature": 0.5}]
    (tmp_path / "run.js").write_text('const mod = await import("./extensions/specar/specar_layouts.js");\n'
                                     f"console.log(JSON.stringify({json.dumps(saved)}.map(mod.migrateSampling)));\n")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"seed": 3, "sampling": "model default"},
                                      {"temperature": 0.7, "top_p": 0.9, "sampling": "custom"},
                                      {"top_p": 0.8, "sampling": "custom"}, saved[3]]
    assert "temperature was" in out.stderr  # the one value it cannot carry over is said


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_migrates_legacy_workflows_and_shows_only_the_chosen_backend(tmp_path, comfy):
    web_extension_folder(tmp_path)
    required = v1.SpecARSampler.INPUT_TYPES()["required"]
    optional = v1.SpecARSampler.INPUT_TYPES().get("optional", {})
    (tmp_path / "node_def.json").write_text(json.dumps({"name": "SpecARSampler",
                                                        "input": {"required": required, "optional": optional}}))
    # a sampler node as SpecAR 0.1 saved it: 16 widgets, the seed's control value after the seed
    legacy = ["a cat", "", 11, "fixed", "sjd_pac", -1.0, 0.9, 0, 1.0, 0, "random", "maximal", 1.0, 2, 3, False, 2]
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    # the example workflow as current ComfyUI saves it (DynamicCombo), opened by a ComfyUI without it
    from support import workflows
    ui = load_json(os.path.join(EXAMPLES, "SpecAR - every backend side by side.json"))
    (tmp_path / "dynamic.json").write_text(json.dumps({str(n["id"]): n["widgets_values"] for n in ui["nodes"]
                                                        if n["type"] == "SpecARSampler"}))
    (tmp_path / "named.json").write_text(json.dumps({str(n["id"]): n for n in ui["nodes"] if n["type"] == "SpecARSampler"}))
    flat_api = workflows.to_flat(load_json(os.path.join(EXAMPLES, "api", "SpecAR - every backend side by side.json")))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
await import("./extensions/specar/specar.js");
const mod = await import("./extensions/specar/specar_layouts.js");
const ext = globalThis.registered;
const def = JSON.parse(readFileSync("node_def.json", "utf8"));
function NodeType() {}
await ext.beforeRegisterNodeDef(NodeType, def);
function makeNode() {
  const node = new NodeType();
  node.size = [300, 900];
  // as the frontend builds it: one widget per input, the seed's control widget right after the seed
  node.widgets = Object.entries({ ...def.input.required, ...def.input.optional }).filter(([n, [k]]) => k !== "SPECAR_MODEL").flatMap(([name, [kind, opts]]) =>
    [{ name, type: Array.isArray(kind) ? "combo" : kind, value: opts.default, callback: null },
     ...(opts.control_after_generate ? [{ name: "control_after_generate", type: "combo", value: "randomize" }] : [])]);
  node.computeSize = function () { return [300, 20 * this.widgets.filter((w) => w.type !== "specar-hidden").length]; };
  node.setSize = function (s) { this.size = s; };
  node.setDirtyCanvas = function () {};
  node.addWidget = function (type, name, value, callback, options) {
    const w = { name, type, value, callback, options };
    this.widgets.push(w);
    return w;
  };
  node.title = "SpecAR Sampler - SJD-PAC";
  node.onNodeCreated();
  return node;
}
const shown = (n) => n.widgets.filter((w) => w.type !== "specar-hidden").map((w) => w.name);
const fresh = makeNode();
const first = shown(fresh);
const backend = fresh.widgets.find((w) => w.name === "backend");
backend.value = "hawk"; backend.callback("hawk");
const afterHawk = shown(fresh);
const titleAfterHawk = fresh.title;
const toggle = fresh.widgets.find((w) => w.name === "advanced inputs");
toggle.value = true; toggle.callback(true);
const afterAdvanced = shown(fresh);
toggle.value = false; toggle.callback(false);
fresh.title = "my hawk";
backend.value = "sjd"; backend.callback("sjd");
const renamedTitle = fresh.title;
backend.value = "hawk"; backend.callback("hawk");
fresh.onExecuted({ specar_stats: [JSON.stringify({ summary: "s", backend: "ar", params: {}, overhead_s: 2.0 })] });
fresh.onExecutionStart();
const statsDuringRun = fresh.widgets.find((w) => w.name === "specar_stats_view").value;
backend.value = "adt_tree"; backend.callback("adt_tree");
const shape = fresh.widgets.find((w) => w.name === "adt_tree_tree_shape");
const mode = fresh.widgets.find((w) => w.name === "adt_tree_candidate_mode");
mode.value = "topk";
shape.value = "best_first"; shape.callback("best_first");
const impliedMode = mode.value;
// the lossy relaxed mode: needs topk candidates (which need layered trees) and same_image_as_ar off
const relaxed = fresh.widgets.find((w) => w.name === "adt_tree_relaxed");
relaxed.value = true; relaxed.callback(true);
const afterRelaxed = { mode: mode.value, shape: shape.value,
  same: fresh.widgets.find((w) => w.name === "same_image_as_ar").value };
const guidance = fresh.widgets.find((w) => w.name === "guidance");
guidance.value = "custom"; guidance.callback("custom");
const afterCustom = shown(fresh);
const old = makeNode();
const legacyValues = JSON.parse(readFileSync("legacy.json", "utf8"));
// the frontend first puts the saved values into the widgets by position, then calls onConfigure
legacyValues.forEach((v, i) => { if (old.widgets[i]) old.widgets[i].value = v; });
old.onConfigure({ widgets_values: legacyValues });
old.onAfterGraphConfigured(); // after the whole graph: the migrated values go in again
const migrated = Object.fromEntries(old.widgets.map((w) => [w.name, w.value]));
const saved = JSON.parse(readFileSync("dynamic.json", "utf8"));
const dyn = {};
for (const [nid, values] of Object.entries(saved)) {
  const n = makeNode();
  n.onConfigure({ widgets_values: values });
  dyn[nid] = Object.fromEntries(n.widgets.map((w) => [w.name, w.value]));
}
// the same nodes with their values by name (properties.specar_inputs): the frontend first puts the saved
// values into the flat widgets by position (wrong places), the extension then applies them by name
const named = {};
const serialized = {};
for (const [nid, info] of Object.entries(JSON.parse(readFileSync("named.json", "utf8")))) {
  const n = makeNode();
  info.widgets_values.forEach((v, i) => { if (n.widgets[i]) n.widgets[i].value = v; });
  n.onConfigure(info);
  n.onAfterGraphConfigured();
  named[nid] = Object.fromEntries(n.widgets.map((w) => [w.name, w.value]));
  const o = { properties: {} };
  n.onSerialize(o);
  serialized[nid] = o.properties.specar_inputs;
}
console.log(JSON.stringify({ first, afterHawk, impliedMode, afterRelaxed, titleAfterHawk, afterAdvanced, renamedTitle, statsDuringRun, afterCustom, migrated, shownOld: shown(old), dyn, named, serialized,
  notes: mod.migrateLegacyValues([...JSON.parse(readFileSync("legacy.json", "utf8"))].map((v, i) => i === 5 ? 2.5 : v), []).notes }));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    default_backend = required["backend"][1]["default"]
    own = lambda b: [f"{b}_{p}" for p in param_names(b)]  # noqa: E731
    essential = lambda b: [f"{b}_{p}" for p in param_names(b) if not spec.is_advanced(b, p)]  # noqa: E731
    backend_inputs = lambda names: [n for n in names if n.startswith(tuple(f"{b}_" for b in SCHEMAS))]  # noqa: E731
    # a few essentials first; the advanced inputs on request
    assert backend_inputs(res["first"]) == essential(default_backend) and len(essential(default_backend)) <= 3
    assert "cfg_scale" not in res["first"] and "guidance" in res["first"]
    assert backend_inputs(res["afterHawk"]) == essential("hawk") != own("hawk")
    assert backend_inputs(res["afterAdvanced"]) == own("hawk")
    # the title follows the backend, unless the user renamed the node
    assert res["titleAfterHawk"] == "SpecAR Sampler - Hawk" and res["renamedTitle"] == "my hawk"
    assert res["statsDuringRun"] == "waiting to run..."  # the previous run's statistics are cleared
    # best_first needs sampled candidates: picking it sets candidate_mode (topk + best_first cannot be picked)
    assert res["impliedMode"] == "sampled"
    assert res["afterRelaxed"] == {"mode": "topk", "shape": "layers", "same": False}
    # what the browser sets is what the node accepts: one message otherwise, naming every input to change
    values = sampler_values(backend="adt_tree", adt_tree_relaxed=True, adt_tree_tree_shape="best_first")
    with pytest.raises(ValueError, match=r"adt_tree_relaxed on needs adt_tree_candidate_mode topk \(now sampled\) and "
                                         r"adt_tree_tree_shape layers \(now best_first\) and same_image_as_ar off"):
        core.backend_config(values)
    core.backend_config({**values, "adt_tree_candidate_mode": "topk", "adt_tree_tree_shape": "layers",
                         "same_image_as_ar": False})
    assert "cfg_scale" in res["afterCustom"] and "top_k" in res["afterCustom"]
    m = res["migrated"]
    assert (m["prompt"], m["seed"], m["backend"], m["temperature"], m["batch_size"]) == ("a cat", 11, "sjd_pac", 0.9, 2)
    assert m["sampling"] == "custom"  # its temperature 0.9 was set, not the model's
    assert m["guidance"] == "model default"  # cfg -1 and top_k 0 were the model's values
    assert (m["sjd_pac_tree_depth"], m["sjd_pac_tree_width"], m["sjd_pac_continuation"]) == (2, 3, False)
    assert m["sjd_pac_window"] == SCHEMAS["sjd_pac"].param("window").default  # window 0 = the backend's default
    # the inputs 0.1 did not have get their defaults back, not the values the frontend put there by position
    defaults = {name: opts.get("default") for name, (kind, opts) in required.items() if name != "model"}
    assert m["preview"] == defaults["preview"] and m["cfg_scale"] == defaults["cfg_scale"]
    others = [f"{b}_{p}" for b in SCHEMAS if b != "sjd_pac" for p in param_names(b)]  # not the chosen backend's
    assert others and {k: m[k] for k in others} == {k: defaults[k] for k in others}
    assert own("sjd_pac")[0] in res["shownOld"] and own("sjd")[0] not in res["shownOld"]
    assert res["notes"] and "top_k" in res["notes"][0]  # an explicit cfg with the model's top-k: said, not hidden
    assert set(res["dyn"]) == {k for k, n in flat_api.items() if n["class_type"] == "SpecARSampler"}
    for nid, got in res["dyn"].items():
        want = {k: v for k, v in flat_api[nid]["inputs"].items() if not isinstance(v, list)}
        assert {k: got[k] for k in want} == want, nid
    # by name: every flat input, the other backends' included, has its API twin's value (their defaults)
    ui_nodes = {str(n["id"]): n for n in ui["nodes"]}
    for nid, got in res["named"].items():
        want = {k: v for k, v in flat_api[nid]["inputs"].items() if not isinstance(v, list)}
        assert {k: got[k] for k in want} == want, nid
        assert res["serialized"][nid] == ui_nodes[nid]["properties"]["specar_inputs"], nid
    # what the browser migrates runs as the server reads the same SpecAR 0.1 values
    model, = execute(v1.SpecARModelLoader, model="demo", device="auto", dtype="auto")[0]
    values = {k: v for k, v in m.items() if k in required and k != "model"}
    old_values = dict(zip(["prompt", "negative_prompt", "seed"], legacy[:3]))
    old_values.update(zip(["backend", "cfg_scale", "temperature", "top_k", "top_p", "window", "init", "coupling",
                           "coupling_strength", "tree_depth", "tree_width", "continuation", "batch_size"], legacy[4:]))
    a = core.run_sampler(model, values)
    b = core.run_sampler(model, old_values)
    assert torch.equal(a[1]["tokens"], b[1]["tokens"])


@pytest.mark.skipif(not shutil.which("node"), reason="needs node to run the web extension")
def test_web_extension_narrows_the_loader_lists_to_the_chosen_model(tmp_path, comfy):
    from support.node_harness import stubs
    web_extension_folder(tmp_path)
    stubs.make_model_folder(comfy["models_dir"], "janus-pro-7b", "janus")
    types = v1.SpecARModelLoader.INPUT_TYPES()
    (tmp_path / "node_def.json").write_text(json.dumps({"name": "SpecARModelLoader", "input": types}))
    (tmp_path / "run.js").write_text("""
import { readFileSync } from "node:fs";
await import("./extensions/specar/specar.js");
const def = JSON.parse(readFileSync("node_def.json", "utf8"));
function NodeType() {}
await globalThis.registered.beforeRegisterNodeDef(NodeType, def);
const node = new NodeType();
node.widgets = Object.entries({ ...def.input.required, ...def.input.optional }).map(([name, [kind, opts]]) =>
  ({ name, value: opts.default, options: { values: Array.isArray(kind) ? kind : [] }, callback: null }));
node.onNodeCreated();
const w = (n) => node.widgets.find((x) => x.name === n);
const lists = () => Object.fromEntries(["resolution", "quantize", "offload"].map((n) => [n, [w(n).value, w(n).options.values]]));
const demo = lists();
w("model").value = "janus-pro-7b"; w("model").callback("janus-pro-7b");
w("resolution").value = "384x384"; w("offload").value = "auto";
const janus = lists();
w("model").value = "demo"; w("model").callback("demo");
const back = lists();
// a saved workflow keeps its value (the queue-time check names what the model allows)
w("model").value = "janus-pro-7b"; w("resolution").value = "1024x768"; node.onConfigure({});
console.log(JSON.stringify({ demo, janus, back, saved: w("resolution").value, savedList: w("resolution").options.values }));
""")
    out = subprocess.run(["node", "run.js"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    allowed = types["required"]["model"][1]["specar_allowed"]
    assert res["demo"]["resolution"] == ["model default", ["model default"]]
    assert res["demo"]["offload"] == ["none", ["none"]] and res["demo"]["quantize"][1] == ["none", "int8", "int4"]
    assert res["janus"]["resolution"] == ["384x384", allowed["janus-pro-7b"]["resolution"]]
    assert res["janus"]["offload"] == ["auto", ["none", "auto"]]
    # back to the demo model: values it does not allow become its first allowed ones
    assert res["back"]["resolution"][0] == "model default" and res["back"]["offload"][0] == "none"
    assert res["saved"] == "1024x768" and res["savedList"] == allowed["janus-pro-7b"]["resolution"]
