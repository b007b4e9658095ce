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

export function hookLoader(nodeType, nodeData) {
  const allowed = allowedValues(nodeData);
  const onNodeCreated = nodeType.prototype.onNodeCreated;
  nodeType.prototype.onNodeCreated = function () {
    const r = onNodeCreated?.apply(this, arguments);
    const model = this.widgets?.find((w) => w.name === "model");
    if (model && !model.specarHooked) {
      const callback = model.callback;
      model.callback = (...args) => {
        const out = callback?.apply(model, args);
        narrowLoader(this, allowed);
        return out;
      };
      model.specarHooked = true;
    }
    narrowLoader(this, allowed);
    return r;
  };
  const onConfigure = nodeType.prototype.onConfigure;
  nodeType.prototype.onConfigure = function () {
    const r = onConfigure?.apply(this, arguments);
    narrowLoader(this, allowed, true);
    return r;
  };
}
