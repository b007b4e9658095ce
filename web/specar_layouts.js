// SpecAR sampler values by name, in every layout ComfyUI saves or shows them in: the one place for layout
// mapping and legacy migration in the browser (nodes/layouts.py is the server's).
// The layouts (flat, DynamicCombo, SpecAR 0.1): nodes/layouts.py's docstring; besides them properties.specar_inputs,
// the values by flat name, which every save writes and every load applies.
// inputs that exist only for one option of a switch, besides "<backend>_<param>" (nodes/spec.py guidance_switch,
// sampler_spec's sampling switch)
export const SWITCH_INPUTS = { guidance: { custom: ["cfg_scale", "top_k"] }, sampling: { custom: ["temperature", "top_p"] } };
export const SWITCHES = ["backend", ...Object.keys(SWITCH_INPUTS)];
export const MODEL_DEFAULT = "model default";
// the SpecAR 0.1 sampler widgets, in their saved order (the seed is followed by its control value)
export const LEGACY_SAMPLER_WIDGETS = [
  "prompt", "negative_prompt", "seed", "backend", "cfg_scale", "temperature", "top_k", "top_p", "window",
  "init", "coupling", "coupling_strength", "tree_depth", "tree_width", "continuation", "batch_size",
];
const LEGACY_INT_DEFAULT_ZERO = ["window"];
const LEGACY_INITS = ["random", "repeat_left", "repeat_above", "sample_left", "sample_above"]; // 0 meant "the backend's own default"

// The option a flat input belongs to: [switch name, option], or null for inputs every option has.
export function switchOf(name, backends) {
  for (const [sw, options] of Object.entries(SWITCH_INPUTS)) {
    for (const [option, inputs] of Object.entries(options)) if (inputs.includes(name)) return [sw, option];
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

// Values saved before the sampling switch (temperature and top_p beside the other inputs, -1 and 0 for the model's
// own values) as the switch holds them: "model default", or "custom" with the values that were set.
export function migrateSampling(values) {
  if ("sampling" in values || !("temperature" in values || "top_p" in values)) return values;
  const out = { ...values };
  const model = { temperature: out.temperature === -1, top_p: out.top_p === 0 };
  out.sampling = model.temperature && model.top_p ? MODEL_DEFAULT : "custom";
  for (const name of ["temperature", "top_p"]) {
    if (!model[name]) continue;
    delete out[name]; // the custom value's default, not the old sentinel
    if (out.sampling === "custom") console.warn(`SpecAR: ${name} was "the model's recommended value"; set it on the node`);
  }
  return out;
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
    if (SWITCHES.includes(name)) chosen[name] = out[name];
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

// Set values by name on a node of either layout: flat names ("sjd_pac_window") or, where the node has
// DynamicCombos, "backend.window" after choosing the option (its callback swaps the option's inputs in);
// there a value of an option not chosen is skipped (another backend's "window" is not this one's).
export function applyValues(node, values, backends) {
  const find = (n) => node.widgets?.find((w) => w.name === n);
  const dynamic = !!node.widgets?.some((w) => w.name.includes("."));
  for (const sw of SWITCHES) {
    const w = find(sw);
    if (w && sw in values) {
      w.value = values[sw];
      if (dynamic) w.callback?.(values[sw]);
    }
  }
  for (const [name, value] of Object.entries(values)) {
    if (SWITCHES.includes(name)) continue;
    let w = find(name);
    if (!w && dynamic) {
      const owner = switchOf(name, backends);
      if (owner && find(owner[0])?.value !== owner[1]) continue;
      if (owner) w = find(owner[0] === "backend" ? "backend." + name.slice(owner[1].length + 1) : `${owner[0]}.${name}`);
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
    if (SWITCHES.includes(w.name)) chosen[w.name] = w.value;
  }
  for (const w of node.widgets || []) {
    if (w.serialize === false) continue; // display only (the statistics box, the advanced toggle)
    let name = w.name;
    if (name.startsWith("backend.")) name = `${chosen.backend}_${name.slice(8)}`;
    else if (name.includes(".")) name = name.slice(name.indexOf(".") + 1); // guidance.cfg_scale, sampling.top_p
    else {
      const owner = switchOf(name, backends);
      if (owner && chosen[owner[0]] !== owner[1]) continue; // a hidden input of an option not chosen
    }
    out[name] = w.value;
  }
  return out;
}

// The values a node loaded from a saved workflow gets, by name (never by position), whatever layout the
// workflow was saved in and the frontend has: `info` as onConfigure receives it, `defaults` every input's
// default by flat name, `keys` the backends. Applies them and returns the values to apply again once the
// whole graph is configured (a DynamicCombo frontend resets its options after onConfigure), or null.
export function restoreValues(node, info, defaults, keys) {
  const saved = info?.widgets_values;
  const byName = info?.properties?.specar_inputs;
  if (byName && typeof byName === "object") {
    // saved with the values by name (SpecAR >= 0.2, the example workflows): every input not named (another
    // option's) gets its default, not a positional leftover
    const values = { ...defaults, ...migrateSampling(byName) };
    applyValues(node, values, keys);
    return values;
  }
  if (isLegacyValues(saved, keys)) {
    const { values, control, notes } = migrateLegacyValues(saved, keys);
    // the frontend has already put the 17 saved values into the first widgets by position: every input
    // 0.1 did not have (e.g. preview) or left at its default gets its default back
    const migrated = { ...defaults, ...migrateSampling(values), control_after_generate: control };
    applyValues(node, migrated, keys);
    node.properties = { ...(node.properties || {}), specar_migrated_from: "0.1" };
    for (const n of notes) console.warn(`SpecAR: migrated a SpecAR 0.1 sampler node: ${n}`);
    return migrated;
  }
  const names = (node.widgets || []).filter((w) => w.serialize !== false).map((w) => w.name);
  if (!node.widgets?.some((w) => w.name.includes(".")) && isDynamicValues(saved, names, keys)) {
    applyValues(node, readDynamicValues(saved, names, keys), keys); // saved with DynamicCombo, loaded flat
  }
  return null;
}
