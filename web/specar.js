// SpecAR web extension for the SpecAR Sampler node:
// - shows only the chosen backend's parameters (and the custom guidance values only when guidance is
//   "custom") where the node's inputs are flat (ComfyUI without the V3 DynamicCombo, or V1 nodes);
// - restores saved values by name whatever layout they were saved in (specar_layouts.js: SpecAR 0.1
//   migration, DynamicCombo <-> flat);
// - shows the generation statistics after a run, in a box that grows with its text.
// The node's `ui` output carries `text` (the one-line summary) and `specar_stats` (GenerationStats as JSON).
import { app } from "../../scripts/app.js";
import { applyValues, eachInput, inputDefaults, namedValues, restoreValues, switchOf } from "./specar_layouts.js";

const WIDGET = "specar_stats_view";

function num(x, digits = 2) {
  return x === null || x === undefined || Number.isNaN(Number(x)) ? "-" : Number(x).toFixed(digits);
}

export function formatStats(json) {
  let s;
  try {
    s = JSON.parse(json);
  } catch (e) {
    return String(json);
  }
  const hist = Object.entries(s.accepted_length_histogram || {})
    .map(([k, v]) => `${k}:${v}`)
    .join(" ");
  const params = Object.entries(s.params || {})
    .map(([k, v]) => `${k}=${v === "" ? "(beside the model)" : v}`) // an empty drafter folder: the model's own
    .join(" ");
  const lines = [
    s.summary || "",
    `backend ${s.backend_label || s.backend}${params ? " (" + params + ")" : ""}${s.batch > 1 ? `, batch ${s.batch}` : ""}`,
    `sampling: cfg ${s.sampling?.cfg_scale ?? "-"}, top-k ${s.sampling?.top_k ?? "-"}, temperature ${s.sampling?.temperature ?? "-"}, top-p ${s.sampling?.top_p ?? "-"}`,
    `image tokens ${s.image_tokens}${s.forced_tokens ? ` (+${s.forced_tokens} forced)` : ""}`,
    `forward passes ${s.nfe} + prefill, step compression ${num(s.step_compression)}x`,
    `mean accepted length ${num(s.mean_accepted_length)}`,
    `accepted lengths ${hist}`,
    `latency ${num(s.latency_s)} s (prefill ${num(s.prefill_s)} s, decode ${num(s.decode_s)} s)`,
  ];
  // the frontend labels the preview with the size it was sent at: the image's own size is said here
  if (s.image_size) lines.push(s.preview_label ? `image ${s.image_size} px; ${s.preview_label}` : `image ${s.image_size} px`);
  if (s.compile) { // this run's compile, not the process's (model_total has those)
    lines.push(s.compile.eager_fallback ? `compile failed, ran eager: ${s.compile.eager_fallback}`
      : `compiled this run: ${s.compile.compiles} graphs in ${num(s.compile.compile_s, 1)} s; ` +
        `${s.compile.graphs_reused} of ${s.compile.graphs_used} graphs reused from earlier runs`);
  }
  if (s.lossy) lines.push("LOSSY: relaxed acceptance was on (not the AR distribution)");
  if (s.speedup_vs_ar !== undefined && s.speedup_vs_ar !== null) {
    lines.push(`AR in the same run: ${num(s.ar_latency_s)} s, ${num(s.speedup_vs_ar)}x${s.lossy ? " (LOSSY run: not a like-for-like speed-up)" : ""}`);
  }
  if (s.backend !== "ar" && s.overhead_s !== null && s.overhead_s !== undefined) { // AR drafts and verifies nothing
    lines.push(`drafting + verification ${num(s.overhead_s)} s of the decode`);
  }
  if (s.peak_memory_bytes) {
    lines.push(`peak memory ${num(s.peak_memory_bytes / 2 ** 30)} GiB`);
  }
  return lines.join("\n");
}

// From the node definition: the readable backend names ({key: label}, for the node's title) and the flat
// names of the advanced inputs (shown on request), whether the definition has them flat or as DynamicCombo options.
export function backendLabels(nodeData) {
  const b = nodeData?.input?.required?.backend;
  return (b && b[1]?.specar_labels) || {};
}

export function advancedInputs(nodeData) {
  const out = new Set();
  eachInput(nodeData, (name, kind, opts) => {
    if (opts?.specar_advanced) out.add(name);
  });
  return out;
}

// Choices that need another parameter's value: picking the first sets the second (a combination the
// backend refuses at run time cannot be picked). Read from the node definition (each backend parameter's
// `specar_implies`, from its declaration in the backend's package): flat name -> value -> {parameter: value}.
export function impliedChoices(nodeData) {
  const out = {};
  eachInput(nodeData, (name, kind, opts) => {
    if (opts?.specar_implies) out[name] = opts.specar_implies;
  });
  return out;
}

// The widget of one backend parameter, flat ("adt_tree_tree_shape") or DynamicCombo ("backend.tree_shape").
function paramWidget(node, backend, param) {
  return node.widgets?.find((w) => w.name === `${backend}_${param}` || w.name === `backend.${param}`);
}

export function hookImplied(node, implied, backends) {
  const backend = node.widgets?.find((w) => w.name === "backend")?.value;
  for (const [flat, byValue] of Object.entries(implied)) {
    if (switchOf(flat, backends)?.[1] !== backend) continue; // another backend's parameter
    const w = paramWidget(node, backend, flat.slice(backend.length + 1));
    if (!w || w.specarImplied) continue;
    const callback = w.callback;
    w.callback = function (value, ...rest) {
      const out = callback?.apply(this, [value, ...rest]);
      for (const [other, forced] of Object.entries(byValue[w.value] || {})) {
        const o = paramWidget(node, backend, other);
        if (o && o.value !== forced) o.value = forced;
      }
      return out;
    };
    w.specarImplied = true;
  }
}

const TITLE_PREFIX = "SpecAR Sampler";

// The node's title follows the backend ("SpecAR Sampler - Hawk") unless the user renamed it.
export function updateTitle(node, labels) {
  const key = node.widgets?.find((w) => w.name === "backend")?.value;
  const label = labels[key] ?? key;
  const auto = node.title === TITLE_PREFIX || Object.values(labels).some((l) => node.title === `${TITLE_PREFIX} - ${l}`);
  if (label && auto) node.title = `${TITLE_PREFIX} - ${label}`;
}

const HIDDEN = "specar-hidden";
const ADVANCED_TOGGLE = "advanced inputs"; // display only, never saved

// Show only the inputs of the chosen backend and guidance (flat layouts: a DynamicCombo does this itself), and of
// those the advanced ones (`advanced`: flat names) only while the node's "advanced inputs" toggle is on.
export function updateVisibility(node, backends, advanced = new Set()) {
  const chosen = {
    backend: node.widgets?.find((w) => w.name === "backend")?.value,
    guidance: node.widgets?.find((w) => w.name === "guidance")?.value,
  };
  let changed = false;
  const showAdvanced = !!node.widgets?.find((w) => w.name === ADVANCED_TOGGLE)?.value;
  for (const w of node.widgets || []) {
    const flatName = w.name.startsWith("backend.") ? `${chosen.backend}_${w.name.slice(8)}` : w.name;
    const owner = w.name.startsWith("backend.") ? ["backend", chosen.backend] : switchOf(w.name, backends);
    if (!owner) continue;
    const show = chosen[owner[0]] === owner[1] && (showAdvanced || !advanced.has(flatName));
    if (!show && w.type !== HIDDEN) {
      w.specarType = w.type;
      w.specarComputeSize = w.computeSize;
      w.type = HIDDEN;
      w.hidden = true;
      w.options = w.options || {};
      w.options.hidden = true; // Vue node rendering leaves out widgets with options.hidden
      w.computeSize = () => [0, -4]; // litegraph: no row for this widget
      changed = true;
    } else if (show && w.type === HIDDEN) {
      w.type = w.specarType;
      w.hidden = false;
      if (w.options) w.options.hidden = false;
      w.computeSize = w.specarComputeSize;
      changed = true;
    }
  }
  if (changed && typeof node.computeSize === "function" && typeof node.setSize === "function") {
    node.setSize([node.size[0], node.computeSize()[1]]);
  }
  return changed;
}

// Rows a text takes in a box `width` px wide at a monospace font whose characters are `charWidth` px
// wide: the lines, each wrapped (the stats' first line is longer than a node is wide).
export function wrappedRows(text, width, charWidth = 6.7) {
  const perLine = Math.max(20, Math.floor(width / charWidth));
  let rows = 0;
  for (const line of String(text ?? "").split("\n")) {
    let col = 0;
    rows += 1;
    for (const word of line.split(" ")) { // wrapped at spaces, as the textarea does; long words broken
      if (col > 0 && col + 1 + word.length <= perLine) {
        col += 1 + word.length;
        continue;
      }
      if (col > 0) rows += 1;
      col = word.length;
      while (col > perLine) {
        rows += 1;
        col -= perLine;
      }
    }
  }
  return rows;
}

const STATS_LINE_PX = 15;

function statsWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (widget) return widget;
  // the box is as tall as its text (wrapped at the node's width), so it never squeezes the prompt box
  // and never hides a line: ComfyUI's frontend lays DOM widgets out by getMinHeight / getMaxHeight
  // (+ 30: the textarea sits 20 px inside its widget, plus its own padding and border)
  const height = () => STATS_LINE_PX * wrappedRows(widget?.value ?? "", (node.size?.[0] ?? 340) - 40) + 30;
  if (typeof node.addDOMWidget === "function") {
    const el = document.createElement("textarea");
    el.readOnly = true;
    el.className = "comfy-multiline-input";
    el.style.fontFamily = "monospace";
    el.style.fontSize = "11px";
    el.style.lineHeight = `${STATS_LINE_PX}px`;
    el.style.width = "100%"; // Vue node rendering: the node's width, not the textarea's default 20 columns
    el.style.boxSizing = "border-box";
    el.style.resize = "none";
    widget = node.addDOMWidget(WIDGET, "specar_stats", el, {
      serialize: false,
      getValue: () => el.value,
      setValue: (v) => {
        el.value = v;
        el.style.minHeight = `${height() - 20}px`; // Vue node rendering sizes the box by its element
      },
      getMinHeight: height,
      getMaxHeight: height,
    });
  } else {
    widget = node.addWidget("text", WIDGET, "", () => {}, { serialize: false });
    widget.computeSize = (width) => [width ?? node.size[0], height()];
  }
  widget.serialize = false; // display only: never saved into the workflow's widget values
  return widget;
}

app.registerExtension({
  name: "specar.sampler",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== "SpecARSampler") return;
    const backendSpec = nodeData.input?.required?.backend;
    const backends = Array.isArray(backendSpec?.[0]) ? backendSpec[0] : backendSpec?.[1]?.options || [];
    const keys = backends.map((b) => (typeof b === "string" ? b : b.key));
    const defaults = inputDefaults(nodeData);
    const labels = backendLabels(nodeData);
    const advanced = advancedInputs(nodeData);
    const implied = impliedChoices(nodeData);
    const refresh = (node) => {
      updateVisibility(node, keys, advanced);
      updateTitle(node, labels);
      hookImplied(node, implied, keys);
    };

    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      for (const name of ["backend", "guidance"]) {
        const w = this.widgets?.find((x) => x.name === name);
        if (!w || w.specarHooked) continue;
        const callback = w.callback;
        w.callback = (...args) => {
          const out = callback?.apply(w, args);
          refresh(this);
          return out;
        };
        w.specarHooked = true;
      }
      if (advanced.size && typeof this.addWidget === "function" && !this.widgets?.some((w) => w.name === ADVANCED_TOGGLE)) {
        const toggle = this.addWidget("toggle", ADVANCED_TOGGLE, false, () => refresh(this), { serialize: false });
        if (toggle) toggle.serialize = false;
      }
      // the statistics box exists from the start (Vue node rendering lays out the widgets a node is created with)
      const stats = statsWidget(this);
      if (!stats.value) stats.value = "statistics appear here after a run";
      refresh(this);
      return r;
    };

    // a new run starts: the previous run's statistics are not this run's
    const onExecutionStart = nodeType.prototype.onExecutionStart;
    nodeType.prototype.onExecutionStart = function () {
      const r = onExecutionStart?.apply(this, arguments);
      const stats = this.widgets?.find((w) => w.name === WIDGET);
      if (stats) stats.value = "running...";
      return r;
    };

    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (info) {
      const r = onConfigure?.apply(this, arguments);
      const values = restoreValues(this, info, defaults, keys);
      if (values) this.specarMigrated = values;
      refresh(this);
      return r;
    };

    const onAfterGraphConfigured = nodeType.prototype.onAfterGraphConfigured;
    nodeType.prototype.onAfterGraphConfigured = function () {
      const r = onAfterGraphConfigured?.apply(this, arguments);
      if (this.specarMigrated) {
        applyValues(this, this.specarMigrated, keys);
        delete this.specarMigrated;
        refresh(this);
      }
      return r;
    };

    const onSerialize = nodeType.prototype.onSerialize;
    nodeType.prototype.onSerialize = function (o) {
      const r = onSerialize?.apply(this, arguments);
      o.properties = { ...(o.properties || {}), specar_inputs: namedValues(this, keys) };
      return r;
    };

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const stats = message?.specar_stats?.[0];
      const text = stats ? formatStats(stats) : message?.text?.[0];
      if (!text) return;
      const widget = statsWidget(this);
      widget.value = text; // a DOM widget forwards this to the textarea (options.setValue)
      const size = this.computeSize();
      this.setSize([Math.max(this.size[0], size[0]), Math.max(this.size[1], size[1])]);
      this.setDirtyCanvas(true, true);
    };
  },
});
