// SpecAR web extension (what it shows: docs/NODES.md, "Nodes"). The SpecAR Sampler: only the chosen backend's and
// switch options' inputs where they are flat, saved values restored by name in any layout (specar_layouts.js), the
// values a choice needs set, the run's state and statistics (specar_stats.js; the node's `ui`: `text` and
// `specar_stats`, JSON). The SpecAR Model Loader: its lists follow the chosen model (specar_loader.js).
import { app } from "../../scripts/app.js";
import { SWITCHES, applyValues, eachInput, inputDefaults, namedValues, restoreValues, switchOf } from "./specar_layouts.js";
import { chainCallback, extend, hookLoader } from "./specar_loader.js";
import { DETAILS_TOGGLE, EXECUTION_EVENTS, executionEvent, showResult, showStats } from "./specar_stats.js";

const SAMPLERS = new Set(); // the sampler nodes of the graph: the execution's events reach each

// From the node definition: the readable backend names ({key: label}, for the node's title).
export function backendLabels(nodeData) {
  const b = nodeData?.input?.required?.backend;
  return (b && b[1]?.specar_labels) || {};
}

// The flat names of the inputs whose definition carries `key` (specar_advanced, specar_moot_when_same_image).
export function flaggedInputs(nodeData, key) {
  const out = new Set();
  eachInput(nodeData, (name, kind, opts) => opts?.[key] && out.add(name));
  return out;
}

// Choices that need another parameter's value: picking the first sets the second (a combination the
// backend refuses at run time cannot be picked), and the second's own needs in turn; a lossy switch turned on
// sets same_image_as_ar off. Read from the node definition (each backend parameter's `specar_implies` and
// `specar_lossy`, from its declaration in the backend's package): flat name -> {implies, lossy}.
export function impliedChoices(nodeData) {
  const out = {};
  eachInput(nodeData, (name, kind, opts) => {
    if (opts?.specar_implies || opts?.specar_lossy) out[name] = { implies: opts.specar_implies || {}, lossy: !!opts.specar_lossy };
  });
  return out;
}

// The widget of one backend parameter, flat ("adt_tree_tree_shape") or DynamicCombo ("backend.tree_shape").
function paramWidget(node, backend, param) {
  return node.widgets?.find((w) => w.name === `${backend}_${param}` || w.name === `backend.${param}`);
}

// What picking `w`'s value needs, applied, then what those values need (each parameter set once).
export function applyImplied(node, implied, backend, param, seen = new Set()) {
  const w = paramWidget(node, backend, param);
  const rule = implied[`${backend}_${param}`];
  if (!w || !rule || seen.has(param)) return;
  seen.add(param);
  if (rule.lossy && w.value) {
    const same = node.widgets?.find((x) => x.name === "same_image_as_ar");
    if (same) same.value = false;
  }
  for (const [other, forced] of Object.entries(rule.implies[String(w.value)] || {})) {
    const o = paramWidget(node, backend, other);
    if (!o || seen.has(other)) continue;
    o.value = forced;
    applyImplied(node, implied, backend, other, seen);
  }
}

export function hookImplied(node, implied, backends) {
  const backend = node.widgets?.find((w) => w.name === "backend")?.value;
  for (const flat of Object.keys(implied)) {
    if (switchOf(flat, backends)?.[1] !== backend) continue; // another backend's parameter
    const param = flat.slice(backend.length + 1);
    const apply = () => applyImplied(node, implied, backend, param);
    chainCallback(paramWidget(node, backend, param), "specarImplied", apply);
  }
}

// The parameters that have no effect with same_image_as_ar on (a re-draft is then AR's own sample;
// specar_moot_when_same_image) greyed out (the frontend's disabled widget: dimmed, not editable) while it is on.
export function updateMoot(node, moot, backends) {
  const same = !!node.widgets?.find((w) => w.name === "same_image_as_ar")?.value;
  const backend = node.widgets?.find((w) => w.name === "backend")?.value;
  for (const w of node.widgets || []) {
    const flat = w.name.startsWith("backend.") ? `${backend}_${w.name.slice(8)}` : w.name;
    if (!moot.has(flat)) continue;
    w.disabled = same;
    if (w.options) w.options.disabled = same; // Vue node rendering reads the widget's options
  }
  node.setDirtyCanvas?.(true, true);
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
  const chosen = Object.fromEntries(SWITCHES.map((s) => [s, node.widgets?.find((w) => w.name === s)?.value]));
  let changed = false;
  const showAdvanced = !!node.widgets?.find((w) => w.name === ADVANCED_TOGGLE)?.value;
  for (const w of node.widgets || []) {
    const flatName = w.name.startsWith("backend.") ? `${chosen.backend}_${w.name.slice(8)}` : w.name;
    const owner = w.name.startsWith("backend.") ? ["backend", chosen.backend] : switchOf(w.name, backends);
    if (!owner) continue;
    if (owner[0] === "backend" && !w.name.includes(".")) w.label = w.name.slice(owner[1].length + 1); // "window"
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

// After switching backend the last run's statistics are another backend's: cleared.
export function backendChanged(node) {
  const backend = node.widgets?.find((w) => w.name === "backend")?.value;
  if (node.specarLast && node.specarLast.backend && node.specarLast.backend !== backend) {
    node.specarLast = null;
    node.specarState = null;
    showStats(node);
  }
}

// A node that did not run keeps no preview of an earlier run under its "not run" text: the frontend draws a
// node's preview from app.nodePreviewImages (by node id on the root graph) into node.imgs, through its
// "$$canvas-image-preview" widget, which is removed as the frontend itself removes it.
export function clearPreview(node) {
  node.specarStalePreview = false;
  for (const key of [String(node.id), node.id]) {
    if (app.nodePreviewImages && key in app.nodePreviewImages) delete app.nodePreviewImages[key];
  }
  node.imgs = undefined;
  const i = node.widgets?.findIndex((w) => w.name === "$$canvas-image-preview") ?? -1;
  if (i >= 0) {
    node.widgets[i].onRemove?.();
    node.widgets.splice(i, 1);
    if (typeof node.computeSize === "function" && typeof node.setSize === "function") {
      node.setSize([node.size[0], node.computeSize()[1]]); // the preview's room goes (the prompt boxes would fill it)
    }
  }
  node.setDirtyCanvas?.(true, true);
}

app.registerExtension({
  name: "specar.sampler",
  async setup() {
    // the execution's events reach every sampler node: the box follows the execution to its end
    for (const kind of EXECUTION_EVENTS) {
      app.api?.addEventListener?.(kind, (e) => {
        for (const node of SAMPLERS) {
          executionEvent(node, kind, e?.detail);
          if (node.specarStalePreview) clearPreview(node);
        }
      });
    }
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name === "SpecARModelLoader") hookLoader(nodeType, nodeData);
    if (nodeData.name !== "SpecARSampler") return;
    const backendSpec = nodeData.input?.required?.backend;
    const backends = Array.isArray(backendSpec?.[0]) ? backendSpec[0] : backendSpec?.[1]?.options || [];
    const keys = backends.map((b) => (typeof b === "string" ? b : b.key));
    const defaults = inputDefaults(nodeData);
    const labels = backendLabels(nodeData);
    const advanced = flaggedInputs(nodeData, "specar_advanced");
    const implied = impliedChoices(nodeData);
    const moot = flaggedInputs(nodeData, "specar_moot_when_same_image");
    const refresh = (node) => {
      updateVisibility(node, keys, advanced);
      updateMoot(node, moot, keys);
      updateTitle(node, labels);
      hookImplied(node, implied, keys);
      backendChanged(node);
    };

    extend(nodeType, "onNodeCreated", function () {
      SAMPLERS.add(this);
      for (const name of [...SWITCHES, "same_image_as_ar"]) {
        chainCallback(this.widgets?.find((x) => x.name === name), "specarHooked", () => refresh(this));
      }
      if (typeof this.addWidget === "function") {
        for (const [name, shouldAdd, onToggle] of [[ADVANCED_TOGGLE, advanced.size > 0, () => refresh(this)],
          [DETAILS_TOGGLE, true, () => showStats(this)]]) {
          if (!shouldAdd || this.widgets?.some((w) => w.name === name)) continue;
          const toggle = this.addWidget("toggle", name, false, onToggle, { serialize: false });
          if (toggle) toggle.serialize = false;
        }
      }
      // the statistics box exists from the start (Vue node rendering lays out the widgets a node is created with)
      showStats(this);
      refresh(this);
    });
    extend(nodeType, "onRemoved", function () {
      SAMPLERS.delete(this);
    });
    // a new run starts: the previous run's statistics are not this run's (the frontend calls this on every node)
    extend(nodeType, "onExecutionStart", function () {
      executionEvent(this, "execution_start");
    });
    extend(nodeType, "onConfigure", function (info) {
      const values = restoreValues(this, info, defaults, keys);
      if (values) this.specarMigrated = values;
      refresh(this);
    });
    extend(nodeType, "onAfterGraphConfigured", function () {
      if (this.specarMigrated) {
        applyValues(this, this.specarMigrated, keys);
        delete this.specarMigrated;
        refresh(this);
      }
    });
    extend(nodeType, "onSerialize", function (o) {
      o.properties = { ...(o.properties || {}), specar_inputs: namedValues(this, keys) };
    });
    extend(nodeType, "onExecuted", function (message) {
      showResult(this, message);
    });
  },
});
