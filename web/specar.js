// SpecAR: show generation statistics on the sampler node after it runs.
import { app } from "../../scripts/app.js";

function formatStats(json) {
  let s;
  try { s = JSON.parse(json); } catch (e) { return String(json); }
  const hist = Object.entries(s.accepted_length_histogram || {})
    .map(([k, v]) => `${k}:${v}`).join(" ");
  return [
    s.summary || "",
    `backend ${s.backend} ${JSON.stringify(s.params || {})}`,
    `image tokens ${s.image_tokens}, decode forwards ${s.nfe}, step compression ${Number(s.step_compression).toFixed(2)}x`,
    `mean accepted length ${Number(s.mean_accepted_length).toFixed(2)}  (histogram ${hist})`,
    `latency ${Number(s.latency_s).toFixed(2)} s (prefill ${Number(s.prefill_s).toFixed(2)} s, decode ${Number(s.decode_s).toFixed(2)} s)`,
  ].join("\n");
}

app.registerExtension({
  name: "specar.stats",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== "SpecARSampler") return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const stats = message?.specar_stats?.[0];
      if (!stats) return;
      let widget = this.widgets?.find((w) => w.name === "specar_stats_view");
      if (!widget) {
        widget = this.addWidget("text", "specar_stats_view", "", () => {}, { multiline: true });
        widget.serialize = false; // display only: never saved into workflows
      }
      widget.value = formatStats(stats);
      this.setDirtyCanvas(true, true);
    };
  },
});
