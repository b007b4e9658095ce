"""The example workflows in example_workflows/, generated from the node specs (so that their widget
values follow the nodes' widget order), for every ComfyUI the pack supports:

- example_workflows/<name>.json: UI format (what ComfyUI saves; its template browser lists these),
  with a <name>.jpg thumbnail. Its widgets_values follow current ComfyUI's layout (>= 0.4.0: the
  sampler's backend and guidance are DynamicCombos); each sampler also carries its values BY NAME in
  `properties.specar_inputs` (flat names: "sjd_pac_window", "cfg_scale"), which web/specar.js applies
  on load, so a frontend that lays the inputs out differently (ComfyUI 0.3.x: flat) gets every value
  on the input it belongs to, never by position;
- example_workflows/api/<name>.json: the API-format twin, for headless runs (POST /prompt) on
  ComfyUI with DynamicCombo ("backend.window" keys);
- example_workflows/api/flat/<name>.json: the same workflow for ComfyUI without DynamicCombo
  (0.3.x, and the V1 nodes): "sjd_pac_window" keys (`to_flat`).

Test support and a maintainer's command (the pack never runs it); tests/test_nodes_workflows.py checks the committed
files are what it writes. Regenerate (and re-render the thumbnails with the demo model):
    python tests/support/workflows.py [--no-thumbnails]
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Callable, Iterator

from specar.nodes import models, spec
from specar.nodes.layouts import _chosen, nest_dotted
from specar.nodes.widgets import Switch, flatten
from specar.samplers.backends import SCHEMAS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
EXAMPLES = os.path.join(ROOT, "example_workflows")

# file names are what ComfyUI's template browser shows on the cards

WORKFLOWS = {
    "SpecAR demo - auto": {
        "note": "SpecAR with the embedded demo model: backend auto (SCD whose window is chosen every step from this "
                "device's measured cost; lossless speculative decoding). With compare_with_ar "
                "on, the node also runs plain AR in the same execution and shows the measured speed-up; the heatmap "
                "shows where long runs of drafts were accepted.",
        "prompt": "a large red circle on a blue background",
        "seed": 7,
        "samplers": [{"backend": "auto", "compare_with_ar": True}],
    },
    "SpecAR - every backend side by side": {
        "note": "Every backend on the demo model, same prompt and seed: " + ", ".join(s.label for s in SCHEMAS.values())
                + ". All sample the same distribution (lossless; ADT-Tree's relaxed mode is off); compare the "
                "forward passes and latency on each node and the acceptance heatmaps. Each accelerated node has "
                "compare_with_ar on: it runs plain AR itself in the same execution, so its speed-up never depends "
                "on the order ComfyUI runs the nodes in.",
        "prompt": "a small yellow star on a noisy green background",
        "seed": 42,
        "samplers": [{"backend": b, "compare_with_ar": b != "ar"} for b in SCHEMAS],
    },
    "SpecAR - GLM-Image": {
        "note": "GLM-Image (zai-org): the released folder in ComfyUI/models/specar/GLM-Image/ and, in ComfyUI's "
                "Python, pip install -r custom_nodes/specar/requirements-glm-image.txt (files and GPU memory: "
                "docs/NODES.md, GLM-Image). The sampler runs the AR stage (a 16x16 preview grid, then the 32x32 "
                "image grid at 1024x1024) with backend auto, losslessly: the same tokens as plain AR for the seed; "
                "the DiT decoder then paints the image. guidance and sampling at \"model default\" take the "
                "checkpoint's own settings (shown on the node after the run). The thumbnail is this workflow run on the "
                "tests' tiny random-weight GLM-Image folder: noise, by design.",
        "prompt": 'a red fox reading a newspaper whose headline says "SpecAR", in a sunny cafe',
        "seed": 3,
        "loader": {"model": "GLM-Image", "resolution": "1024x1024"},  # a folder under models/specar, not the demo
        "samplers": [{"backend": "auto"}],
    },
    "SpecAR - Emu3.5-Image": {
        "note": "Emu3.5-Image (BAAI, 34 B): the released folder in ComfyUI/models/specar/Emu3.5-Image/ and "
                "BAAI/Emu3.5-VisionTokenizer in ComfyUI/models/specar/Emu3.5-VisionTokenizer/ (files and GPU memory: "
                "docs/NODES.md, Emu3.5; on a 24 GiB card quantize int4). 1024x1024 (64 x 64 codes, a row end each) "
                "with backend auto, losslessly: the same image as plain AR for the seed; model default guidance is "
                "the checkpoint's recommended cfg 5, top-k 5120. The thumbnail is this workflow run on the tests' "
                "tiny random-weight Emu3.5-Image folder: noise, by design.",
        "prompt": "a lighthouse on a cliff at dawn, watercolour",
        "seed": 5,
        "loader": {"model": "Emu3.5-Image", "resolution": "1024x1024"},
        "samplers": [{"backend": "auto"}],
    },
}
GLM_EXAMPLE = "SpecAR - GLM-Image"  # its thumbnail needs a GLM-Image folder: `--glm-image-folder`
EMU35_EXAMPLE = "SpecAR - Emu3.5-Image"  # and this one an Emu3.5-Image folder: `--emu35-folder`


def flat_widgets(node) -> list:
    """A node declaration's widgets in the flat layout (V1; V3 without DynamicCombo), in order."""
    return [w for w in flatten(node.inputs) if w.is_widget]


def title(backend: str) -> str:
    return SCHEMAS[backend].label


def sampler_values(prompt: str, seed: int, **overrides) -> dict:
    """Every sampler widget's value (flat layout): its default, unless given."""
    values = {w.name: w.default for w in flat_widgets(spec.sampler_spec())}
    values.update(prompt=prompt, seed=seed, negative_prompt="")
    unknown = set(overrides) - set(values)
    if unknown:
        raise ValueError(f"not sampler widgets: {sorted(unknown)}")
    values.update(overrides)
    return values


def loader_values() -> dict:
    """The loader's defaults (the embedded demo model)."""
    return {w.name: w.default for w in flat_widgets(spec.loader_spec(list))}


def build_api(desc: dict) -> dict:
    prompt = {"1": {"class_type": "SpecARModelLoader", "inputs": {**loader_values(), **desc.get("loader", {})},
                    "_meta": {"title": "SpecAR Model Loader"}}}
    for i, s in enumerate(desc["samplers"]):
        sid, img, heat = str(10 + i), str(20 + i), str(30 + i)
        name = title(s["backend"])
        prompt[sid] = {"class_type": "SpecARSampler",
                       "inputs": {"model": ["1", 0],
                                  **dynamic_inputs(sampler_values(desc["prompt"], desc["seed"], **s))},
                       "_meta": {"title": f"SpecAR Sampler - {name}"}}
        # the image is saved (ComfyUI/output/specar/<backend>_00001_.png); the heatmap only previewed
        prompt[img] = {"class_type": "SaveImage", "inputs": {"filename_prefix": f"specar/{s['backend']}",
                                                             "images": [sid, 0]},
                       "_meta": {"title": f"{name} image (saved)"}}
        prompt[heat] = {"class_type": "PreviewImage", "inputs": {"images": [sid, 3]},
                        "_meta": {"title": f"{name} acceptance heatmap"}}
    return prompt


def build_ui(desc: dict) -> dict:
    """UI format: the API graph laid out in columns, widget values in widget order."""
    api = build_api(desc)
    sampler = spec.sampler_spec()
    out_types = [o.kind for o in sampler.outputs]
    nodes, links = [], []
    link_id = 0
    incoming = {}  # (dst, slot) -> link id
    outgoing = {}  # (src, slot) -> [link ids]
    for dst, node in api.items():
        slot = 0
        for name, value in node["inputs"].items():
            if isinstance(value, list):
                link_id += 1
                src, src_slot = value
                kind = "SPECAR_MODEL" if api[src]["class_type"] == "SpecARModelLoader" else out_types[src_slot]
                links.append([link_id, int(src), src_slot, int(dst), slot, kind])
                incoming[(dst, name)] = (link_id, kind)
                outgoing.setdefault((src, src_slot), []).append(link_id)
                slot += 1
    order = 0
    n_samplers = sum(node["class_type"] == "SpecARSampler" for node in api.values())
    for nid, node in api.items():
        ct, title = node["class_type"], node["_meta"]["title"]
        i = int(nid) % 10
        if ct == "SpecARModelLoader":
            pos, size = [40, 120], [320, 130]
            widgets = [node["inputs"][k] for k in loader_values()]  # the loader's values in its widget order
            inputs = []
            outputs = [{"name": "model", "type": "SPECAR_MODEL", "links": outgoing.get((nid, 0), []), "slot_index": 0}]
        elif ct == "SpecARSampler":
            pos, size = [400 + 360 * i, 40], [340, 700]
            named = named_values(node["inputs"])
            widgets = list(named.values())  # the order the frontend saves them in
            link, kind = incoming[(nid, "model")]
            inputs = [{"name": "model", "type": kind, "link": link}]
            outputs = [{"name": o.name, "type": o.kind, "links": outgoing.get((nid, k)) or None, "slot_index": k}
                       for k, o in enumerate(sampler.outputs)]
        else:  # SaveImage (the image) or PreviewImage (the heatmap)
            row = 0 if int(nid) < 30 else 1
            # rows 500 px apart: Vue node rendering draws an image node taller than its saved size
            if n_samplers == 1:  # beside the sampler, which grows by its preview and statistics after a run
                pos, size = [780, 40 + 500 * row], [340, 350]
            else:  # below, leaving the samplers room to grow by their preview, statistics details and advanced
                # inputs (the tallest, ADT-Tree's, 1504 px in frontend 1.49.6: make test-ui)
                pos, size = [400 + 360 * i, 1700 + 500 * row], [340, 350]
            widgets = [node["inputs"]["filename_prefix"]] if ct == "SaveImage" else []
            link, kind = incoming[(nid, "images")]
            inputs = [{"name": "images", "type": kind, "link": link}]
            outputs = []
        properties = {"Node name for S&R": ct}
        if ct == "SpecARSampler":
            properties["specar_inputs"] = named
        nodes.append({"id": int(nid), "type": ct, "title": title, "pos": pos, "size": size, "flags": {},
                      "order": order, "mode": 0, "inputs": inputs, "outputs": outputs,
                      "properties": properties, "widgets_values": widgets})
        order += 1
    nodes.append({"id": 90, "type": "Note", "title": "About this workflow", "pos": [40, 440], "size": [320, 260],
                  "flags": {}, "order": order, "mode": 0, "inputs": [], "outputs": [], "properties": {},
                  "widgets_values": [desc["note"] + "\n\nMore: docs/NODES.md in the SpecAR pack."],
                  "color": "#432", "bgcolor": "#653"})
    return {"last_node_id": max(n["id"] for n in nodes), "last_link_id": link_id, "nodes": nodes, "links": links,
            "groups": [], "config": {}, "extra": {"ds": {"scale": 0.8, "offset": [0, 0]}}, "version": 0.4}


# the layouts of a whole API prompt, and a sampler's values by name

def chosen_inputs(choice: Callable[[Switch], str]) -> Iterator[tuple]:
    """(name in the DynamicCombo layout, flat name, widget) of every sampler widget for the switch choices
    `choice(switch)` gives, in input order: the common inputs, and each switch followed by its chosen
    option's inputs ("backend.window" / "sjd_pac_window")."""
    for w in spec.sampler_spec().inputs:
        if isinstance(w, Switch):
            key = choice(w)
            yield w.name, w.name, w
            for sub in w.options[key]:
                yield f"{w.name}.{sub.name}", w.flat_name(key, sub), sub
        elif w.is_widget:
            yield w.name, w.name, w


def dynamic_inputs(flat: dict) -> dict:
    """Flat sampler values -> the API-format inputs of the DynamicCombo layout: "backend": key and
    "backend.<param>" for the chosen backend's parameters only; the same for guidance."""
    return {name: flat[flat_name] for name, flat_name, _ in chosen_inputs(lambda sw: flat[sw.name])}


def to_flat(prompt: dict) -> dict:
    """An API-format workflow of the DynamicCombo layout -> the flat layout of ComfyUI without
    DynamicCombo (and of the V1 nodes): "backend.window" of backend sjd_pac becomes "sjd_pac_window",
    the other backends' inputs take their defaults."""
    out = json.loads(json.dumps(prompt))
    switches = {w.name: w for w in spec.sampler_spec().inputs if isinstance(w, Switch)}
    for node in out.values():
        if node["class_type"] != "SpecARSampler":
            continue
        flat = {w.name: w.default for w in flat_widgets(spec.sampler_spec())}
        links = {}
        for name, value in nest_dotted(node["inputs"]).items():
            if isinstance(value, dict):
                key, option = _chosen({name: value}, name)
                flat[name] = key
                sw = switches[name]
                flat.update({sw.flat_name(key, sub): option[sub.name] for sub in sw.options[key]})
            elif isinstance(value, list):
                links[name] = value
            else:
                flat[name] = value
        node["inputs"] = {**links, **flat}
    return out


def named_values(inputs: dict) -> dict:
    """A sampler's values by flat name (`properties.specar_inputs` of the UI format): the common inputs,
    each switch's choice and its chosen option's inputs ("sjd_pac_window", "cfg_scale"), and the seed's
    control; what web/specar_layouts.js applies by name whatever layout the frontend has. In this order
    they are also the widgets_values the frontend saves in the DynamicCombo layout."""
    named = {}
    for name, flat_name, w in chosen_inputs(lambda sw: inputs[sw.name]):
        named[flat_name] = inputs[name]
        if getattr(w, "control_after_generate", False):
            named["control_after_generate"] = "fixed"
    return named



def render_thumbnail(desc: dict, path: str, folder: str = None) -> None:
    """Run the workflow's samplers with the demo model (or the model `folder`, at the workflow's resolution) and
    save image + heatmap per backend as a JPEG."""
    from PIL import Image, ImageDraw

    from specar.model_loaders.registry import load_model
    from specar.nodes import core

    model = models.load_cached(model="demo", device="cpu") if folder is None else \
        load_model(folder, device="cpu", resolution=desc["loader"]["resolution"])
    api = build_api(desc)
    tiles = []
    for nid, node in api.items():
        if node["class_type"] != "SpecARSampler":
            continue
        values = {k: v for k, v in node["inputs"].items() if k != "model"}
        image, _, stats, heat, _ = core.run_sampler(model, values)
        steps = json.loads(stats)["nfe"] + 1
        tiles.append((title(values["backend"]), steps, image[0], heat[0]))
    cell = 192
    single = len(tiles) == 1  # one sampler: image and heatmap side by side
    cols, rows = (2, 1) if single else (len(tiles), 2)
    canvas = Image.new("RGB", (cols * cell, rows * cell + 44), (24, 24, 28))
    draw = ImageDraw.Draw(canvas)
    for k, (label, steps, image, heat) in enumerate(tiles):
        for j, t in enumerate((image, heat)):
            x, y = ((j, 0) if single else (k, j))
            im = Image.fromarray((t.numpy() * 255).round().astype("uint8")).resize((cell - 8, cell - 8), Image.NEAREST)
            canvas.paste(im, (x * cell + 4, 22 + y * cell))
        draw.text((k * cell + 6, 4), label, fill=(235, 235, 235))
        draw.text((k * cell + 6, rows * cell + 26), f"{steps} forward passes", fill=(235, 235, 235))
    if single:
        draw.text((cell + 6, 4), "acceptance heatmap", fill=(235, 235, 235))
    canvas.save(path, quality=88)


FLAT_API = os.path.join(EXAMPLES, "api", "flat")  # API twins for ComfyUI without DynamicCombo (0.3.x, V1 nodes)


def write_all(thumbnails: bool = True, glm_image_folder: str = None, emu35_folder: str = None) -> list:
    """Every example's files; the thumbnails rendered (GLM-Image's and Emu3.5's only with their folder, else kept)."""
    folders = {GLM_EXAMPLE: glm_image_folder, EMU35_EXAMPLE: emu35_folder}
    os.makedirs(FLAT_API, exist_ok=True)
    written = []
    for name, desc in WORKFLOWS.items():
        for path, data in ((os.path.join(EXAMPLES, f"{name}.json"), build_ui(desc)),
                           (os.path.join(EXAMPLES, "api", f"{name}.json"), build_api(desc)),
                           (os.path.join(FLAT_API, f"{name}.json"), to_flat(build_api(desc)))):
            with open(path, "w") as f:
                json.dump(data, f, indent=1)
                f.write("\n")
            written.append(path)
        if thumbnails and folders.get(name, True):
            path = os.path.join(EXAMPLES, f"{name}.jpg")
            render_thumbnail(desc, path, folders.get(name))
            written.append(path)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-thumbnails", action="store_true", help="do not render the .jpg thumbnails")
    ap.add_argument("--flat", metavar="API_JSON", help="print this API-format workflow in the flat layout (for a "
                    "ComfyUI without DynamicCombo, before 0.4.0) instead of writing the examples")
    ap.add_argument("--glm-image-folder", metavar="DIR", help="a GLM-Image folder (e.g. the tests' tiny one) to "
                    "render the GLM-Image example's thumbnail with; without it that thumbnail is kept")
    ap.add_argument("--emu35-folder", metavar="DIR", help="the same for the Emu3.5-Image example")
    args = ap.parse_args(argv)
    if args.flat:
        with open(args.flat) as f:
            print(json.dumps(to_flat(json.load(f)), indent=1))
        return
    for path in write_all(not args.no_thumbnails, args.glm_image_folder, args.emu35_folder):
        print(path)


if __name__ == "__main__":
    main()
