// SpecAR web extension for the SpecAR Sampler node:
// - shows only the chosen backend's parameters (and the custom guidance values only when guidance is
//   "custom") where the node's inputs are flat (ComfyUI without the V3 DynamicCombo, or V1 nodes);
// - migrates workflows saved by SpecAR 0.1 (shared parameter names, sentinel values) on load, and reads
//   workflows saved with DynamicCombo (current ComfyUI, the example workflows) onto flat inputs;
// - shows the generation statistics after a run, in a box that grows with its text.
// The node's `ui` output carries `text` (the one-line summary) and `specar_stats` (GenerationStats as JSON).
import { app } from "../../scripts/app.js";

const WIDGET = "specar_stats_view";
// inputs that exist only for one option of a switch, besides "<backend>_<param>" (nodes/spec.py guidance_switch)
export const GUIDANCE_INPUTS = { custom: ["cfg_scale", "top_k"] };
export const MODEL_DEFAULT = "model default";
// the SpecAR 0.1 sampler widgets, in their saved order (the seed is followed by its control value)
export const LEGACY_SAMPLER_WIDGETS = [
  "prompt", "negative_prompt", "seed", "backend", "cfg_scale", "temperature", "top_k", "top_p", "window",
  "init", "coupling", "coupling_strength", "tree_depth", "tree_width", "continuation", "batch_size",
];
const LEGACY_INT_DEFAULT_ZERO = ["window"];
const LEGACY_INITS = ["random", "repeat_left", "repeat_above", "sample_left", "sample_above"]; // 0 meant "the backend's own default"

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

// The option a flat input belongs to: [switch name, option], or null for inputs every option has.
export function switchOf(name, backends) {
  for (const [option, inputs] of Object.entries(GUIDANCE_INPUTS)) {
    if (inputs.includes(name)) return ["guidance", option];
  }
  let best = null;
  for (const b of backends) {
    if (name.startsWith(b + "_") && (!best || b.length > best.length)) best = b;
  }
  return best ? ["backend", best] : null;
}

// Widget values of a SpecAR 0.1 sampler -> {widget name: value} of the current inputs, plus notes on
// what could not be carried over exactly. `values` is the saved widgets_values list.
export function migrateLegacyValues(values, backends) {
  const v = [...values];
  v.splice(3, 1); // the seed's control value
  const control = values[3];
  const old = Object.fromEntries(LEGACY_SAMPLER_WIDGETS.map((n, i) => [n, v[i]]));
  const out = {
    prompt: old.prompt, negative_prompt: old.negative_prompt, seed: old.seed, backend: old.backend,
    temperature: old.temperature, top_p: old.top_p, batch_size: old.batch_size,
  };
  const notes = [];
  for (const name of LEGACY_SAMPLER_WIDGETS.slice(8, 15)) {
    if (LEGACY_INT_DEFAULT_ZERO.includes(name) && old[name] === 0) continue; // keep the backend's default
    out[`${old.backend}_${name}`] = old[name];
  }
  const cfgDefault = old.cfg_scale < 0;
  const topkDefault = old.top_k === 0;
  if (cfgDefault && topkDefault) {
    out.guidance = MODEL_DEFAULT;
  } else {
    out.guidance = "custom";
    if (!cfgDefault) out.cfg_scale = old.cfg_scale;
    if (!topkDefault) out.top_k = old.top_k;
    if (cfgDefault || topkDefault) {
      notes.push(`${cfgDefault ? "cfg_scale" : "top_k"} was "the model's recommended value"; set it on the node`);
    }
  }
  return { values: out, control, notes };
}

export function isLegacyValues(values, backends) {
  // the 0.1 layout: 17 values with init and coupling at fixed places and continuation a boolean (a
  // DynamicCombo layout can also have 17 values, never with these types at these places)
  return Array.isArray(values) && values.length === LEGACY_SAMPLER_WIDGETS.length + 1 &&
    backends.includes(values[4]) && typeof values[5] === "number" && LEGACY_INITS.includes(values[10]) &&
    ["maximal", "gumbel"].includes(values[11]) && typeof values[15] === "boolean";
}

// widgets_values saved by a ComfyUI with DynamicCombo (a switch's key, then only its chosen option's
// values), read onto the flat inputs of a ComfyUI without it: walking the flat widgets in order and
// skipping the inputs of options not chosen meets the values in the order they were saved.
export function readDynamicValues(values, widgetNames, backends) {
  const out = {};
  const chosen = {};
  let i = 0;
  for (const name of widgetNames) {
    const owner = switchOf(name, backends);
    if (owner && chosen[owner[0]] !== owner[1]) continue; // an option not chosen: nothing was saved
    if (i >= values.length) break;
    out[name] = values[i++];
    if (name === "backend" || name === "guidance") chosen[name] = out[name];
  }
  return out;
}

export function isDynamicValues(values, widgetNames, backends) {
  return Array.isArray(values) && values.length !== widgetNames.length && backends.includes(values[4]) &&
    !isLegacyValues(values, backends);
}

// The default of every input of the node definition, by flat name: "<backend>_<param>" for a backend's
// own inputs, "cfg_scale" / "top_k" for the custom guidance's, whether the definition has them flat or
// as DynamicCombo options (`nodeData` as the frontend hands it to beforeRegisterNodeDef).
export function inputDefaults(nodeData) {
  const out = {};
  eachInput(nodeData, (name, kind, opts) => {
    if (opts && "default" in opts) out[name] = opts.default;
    else if (Array.isArray(kind) && kind.length) out[name] = kind[0];
  });
  return out;
}

// Calls fn(flat name, kind, options) for every input of the node definition: flat inputs as they are, a
// DynamicCombo's option inputs under their flat names ("<backend>_<param>", the guidance's own names).
export function eachInput(nodeData, fn) {
  const all = { ...(nodeData?.input?.required || {}), ...(nodeData?.input?.optional || {}) };
  for (const [name, [kind, opts]] of Object.entries(all)) {
    if (kind !== "COMFY_DYNAMICCOMBO_V3") {
      fn(name, kind, opts);
      continue;
    }
    for (const o of opts?.options || []) {
      const inputs = { ...(o.inputs?.required || {}), ...(o.inputs?.optional || {}) };
      for (const [sub, [subKind, so]] of Object.entries(inputs)) fn(name === "backend" ? `${o.key}_${sub}` : sub, subKind, so);
    }
  }
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
// backend refuses at run time cannot be picked). backend -> parameter -> value -> {parameter: value}
export const IMPLIED = {
  adt_tree: {
    tree_shape: { best_first: { candidate_mode: "sampled" } },
    candidate_mode: { topk: { tree_shape: "layers" } },
  },
};

// The widget of one backend parameter, flat ("adt_tree_tree_shape") or DynamicCombo ("backend.tree_shape").
function paramWidget(node, backend, param) {
  return node.widgets?.find((w) => w.name === `${backend}_${param}` || w.name === `backend.${param}`);
}

export function hookImplied(node) {
  const backend = node.widgets?.find((w) => w.name === "backend")?.value;
  for (const [param, byValue] of Object.entries(IMPLIED[backend] || {})) {
    const w = paramWidget(node, backend, param);
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

// Set values by name on a node of either layout: flat names ("sjd_pac_window") or, where the node has
// DynamicCombos, "backend.window" after choosing the option (its callback swaps the option's inputs in);
// there a value of an option not chosen is skipped (another backend's "window" is not this one's).
export function applyValues(node, values, backends) {
  const find = (n) => node.widgets?.find((w) => w.name === n);
  const dynamic = !!node.widgets?.some((w) => w.name.includes("."));
  for (const sw of ["backend", "guidance"]) {
    const w = find(sw);
    if (w && sw in values) {
      w.value = values[sw];
      if (dynamic) w.callback?.(values[sw]);
    }
  }
  for (const [name, value] of Object.entries(values)) {
    if (name === "backend" || name === "guidance") continue;
    let w = find(name);
    if (!w && dynamic) {
      const owner = switchOf(name, backends);
      if (owner && find(owner[0])?.value !== owner[1]) continue;
      if (owner?.[0] === "backend") w = find("backend." + name.slice(owner[1].length + 1));
      if (owner?.[0] === "guidance") w = find("guidance." + name);
    }
    if (w) w.value = value;
  }
}

// The node's values by flat name ("sjd_pac_window", "cfg_scale"), whatever its layout: what the node saves in
// properties.specar_inputs, so a frontend with another layout (flat / DynamicCombo) reads every value by name.
// The inputs of options not chosen are left out (their defaults apply).
export function namedValues(node, backends) {
  const out = {};
  const chosen = {};
  for (const w of node.widgets || []) {
    if (w.name === "backend" || w.name === "guidance") chosen[w.name] = w.value;
  }
  for (const w of node.widgets || []) {
    if (w.serialize === false || w.name === WIDGET) continue;
    let name = w.name;
    if (name.startsWith("backend.")) name = `${chosen.backend}_${name.slice(8)}`;
    else if (name.startsWith("guidance.")) name = name.slice(9);
    else {
      const owner = switchOf(name, backends);
      if (owner && chosen[owner[0]] !== owner[1]) continue; // a hidden input of an option not chosen
    }
    out[name] = w.value;
  }
  return out;
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
    const refresh = (node) => {
      updateVisibility(node, keys, advanced);
      updateTitle(node, labels);
      hookImplied(node);
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
      const saved = info?.widgets_values;
      const names = (this.widgets || []).filter((w) => w.serialize !== false).map((w) => w.name);
      const byName = info?.properties?.specar_inputs;
      if (byName && typeof byName === "object") {
        // saved with the values by name (SpecAR >= 0.2, the example workflows): applied by name, never by
        // position; every input not named (another option's) gets its default, not a positional leftover.
        // Applied again once the graph is configured (a DynamicCombo frontend resets its options after this).
        const values = { ...defaults, ...byName };
        applyValues(this, values, keys);
        this.specarMigrated = values;
      } else if (isLegacyValues(saved, keys)) {
        const { values, control, notes } = migrateLegacyValues(saved, keys);
        // the frontend has already put the 17 saved values into the first widgets by position: every input
        // 0.1 did not have (e.g. preview) or left at its default gets its default back
        const migrated = { ...defaults, ...values, control_after_generate: control };
        applyValues(this, migrated, keys);
        // ComfyUI's frontend (1.49.6) sets a DynamicCombo's value again after onConfigure, and its value
        // setter rebuilds the option's inputs at their defaults: the values go in again once the whole
        // graph is configured (onAfterGraphConfigured, called by loadGraphData and paste)
        this.specarMigrated = migrated;
        this.properties = { ...(this.properties || {}), specar_migrated_from: "0.1" };
        for (const n of notes) console.warn(`SpecAR: migrated a SpecAR 0.1 sampler node: ${n}`);
      } else if (!this.widgets?.some((w) => w.name.includes(".")) && isDynamicValues(saved, names, keys)) {
        applyValues(this, readDynamicValues(saved, names, keys), keys); // saved with DynamicCombo, loaded flat
      }
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
