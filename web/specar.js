// SpecAR: show the generation statistics on the SpecAR Sampler node after it runs.
// The node's `ui` output carries `text` (the one-line summary) and `specar_stats` (GenerationStats as JSON).
import { app } from "../../scripts/app.js";

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
    .map(([k, v]) => `${k}=${v}`)
    .join(" ");
  const lines = [
    s.summary || "",
    `backend ${s.backend}${params ? " (" + params + ")" : ""}${s.batch > 1 ? `, batch ${s.batch}` : ""}`,
    `image tokens ${s.image_tokens}${s.forced_tokens ? ` (+${s.forced_tokens} forced)` : ""}`,
    `forward passes ${s.nfe} + prefill, step compression ${num(s.step_compression)}x`,
    `mean accepted length ${num(s.mean_accepted_length)}`,
    `accepted lengths ${hist}`,
    `latency ${num(s.latency_s)} s (prefill ${num(s.prefill_s)} s, decode ${num(s.decode_s)} s)`,
  ];
  if (s.overhead_s !== null && s.overhead_s !== undefined) {
    lines.push(`drafting + verification ${num(s.overhead_s)} s of the decode`);
  }
  if (s.peak_memory_bytes) {
    lines.push(`peak memory ${num(s.peak_memory_bytes / 2 ** 30)} GiB`);
  }
  return lines.join("\n");
}

function statsWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (widget) return widget;
  if (typeof node.addDOMWidget === "function") {
    const el = document.createElement("textarea");
    el.readOnly = true;
    el.className = "comfy-multiline-input";
    el.style.fontFamily = "monospace";
    el.style.fontSize = "11px";
    el.rows = 8;
    widget = node.addDOMWidget(WIDGET, "specar_stats", el, {
      serialize: false,
      getValue: () => el.value,
      setValue: (v) => {
        el.value = v;
      },
    });
  } else {
    widget = node.addWidget("text", WIDGET, "", () => {}, { serialize: false });
  }
  widget.serialize = false; // display only: never saved into the workflow's widget values
  return widget;
}

app.registerExtension({
  name: "specar.stats",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== "SpecARSampler") return;
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
