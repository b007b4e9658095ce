// The SpecAR Model Loader's lists follow the chosen model: the sizes, quantization and offload its family
// allows (the server sends them as the model input's `specar_allowed`: {model: {input: [values]}}); the same
// check refuses any other value when a prompt is queued (nodes/models.py loader_error).

export function allowedValues(nodeData) {
  const model = nodeData?.input?.required?.model;
  return (model && model[1]?.specar_allowed) || {};
}

// Narrow the node's lists to what its model allows. `keep`: a value not allowed stays (a saved workflow keeps
// its value, which the queue-time check then names); otherwise it becomes the first allowed one.
export function narrowLoader(node, allowed, keep = false) {
  const model = node.widgets?.find((w) => w.name === "model")?.value;
  const lists = allowed[model];
  if (!lists) return;
  for (const [name, values] of Object.entries(lists)) {
    const w = node.widgets?.find((x) => x.name === name);
    if (!w) continue;
    w.options = { ...(w.options || {}), values: [...values] };
    if (!keep && !values.includes(w.value)) w.value = values[0];
  }
  node.setDirtyCanvas?.(true, true);
}

// Run `after` once the node type's own `name` method (if any) has run, with the same arguments; its result is kept.
export function extend(nodeType, name, after) {
  const original = nodeType.prototype[name];
  nodeType.prototype[name] = function (...args) {
    const r = original?.apply(this, args);
    after.apply(this, args);
    return r;
  };
}

// Run `after` once the widget's own callback (if any) has run on a change of its value; its result is kept. `flag`:
// the widget property that marks it done, so that a widget is hooked once however often this is called.
export function chainCallback(widget, flag, after) {
  if (!widget || widget[flag]) return;
  const callback = widget.callback;
  widget.callback = (...args) => {
    const out = callback?.apply(widget, args);
    after();
    return out;
  };
  widget[flag] = true;
}

export function hookLoader(nodeType, nodeData) {
  const allowed = allowedValues(nodeData);
  extend(nodeType, "onNodeCreated", function () {
    chainCallback(this.widgets?.find((w) => w.name === "model"), "specarHooked", () => narrowLoader(this, allowed));
    narrowLoader(this, allowed);
  });
  extend(nodeType, "onConfigure", function () {
    narrowLoader(this, allowed, true);
  });
}
