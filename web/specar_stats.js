// The SpecAR Sampler's statistics box: what the last run measured (one summary line, the details folded
// behind the node's "statistics details" toggle), and what the node is doing now, following the execution
// to its end whatever ends it (ComfyUI's frontend API events: execution_start, executing, executed,
// execution_error, execution_interrupted, execution_success, and SpecAR's specar_stage during a compile).
export const WIDGET = "specar_stats_view";
export const DETAILS_TOGGLE = "statistics details"; // display only, never saved
export const IDLE_TEXT = "statistics appear here after a run";

function num(x, digits = 2) {
  return x === null || x === undefined || Number.isNaN(Number(x)) ? "-" : Number(x).toFixed(digits);
}

// The node's `specar_stats` JSON -> {summary: one line, details: the rest, lines joined}.
export function formatStats(json) {
  let s;
  try {
    s = JSON.parse(json);
  } catch (e) {
    return { summary: String(json), details: "" };
  }
  const hist = Object.entries(s.accepted_length_histogram || {}).map(([k, v]) => `${k}:${v}`).join(" ");
  const params = Object.entries(s.params || {})
    .map(([k, v]) => `${k}=${v === "" ? "(beside the model)" : v}`) // an empty drafter folder: the model's own
    .join(" ");
  const lines = [
    ...(s.notes || []),
    `backend ${s.backend_label || s.backend}${params ? " (" + params + ")" : ""}${s.batch > 1 ? `, batch ${s.batch}` : ""}`,
    `model ${s.model ?? "-"}, weights ${!s.quantization || s.quantization === "none" ? "as stored (not quantized)" : `quantized ${s.quantization}`}`,
    `same_image_as_ar ${s.reproducible ? "on" : "off"}${s.lossy ? "; LOSSY: relaxed acceptance was on (not the AR distribution)" : ""}`,
    `sampling: cfg ${s.sampling?.cfg_scale ?? "-"}, top-k ${s.sampling?.top_k ?? "-"}, temperature ${s.sampling?.temperature ?? "-"}, top-p ${s.sampling?.top_p ?? "-"}`,
    `image tokens ${s.image_tokens}${s.forced_tokens ? ` (+${s.forced_tokens} forced)` : ""}`,
    `forward passes ${s.nfe} + prefill, ${num(s.step_compression)} tokens per forward`,
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
  if (s.speedup_vs_ar !== undefined && s.speedup_vs_ar !== null) {
    lines.push(`AR in the same run: ${num(s.ar_latency_s)} s, ${num(s.speedup_vs_ar)}x${s.lossy ? " (LOSSY run: not a like-for-like speed-up)" : ""}`);
  }
  if (s.backend !== "ar" && s.overhead_s !== null && s.overhead_s !== undefined) { // AR drafts and verifies nothing
    lines.push(`drafting + verification ${num(s.overhead_s)} s of the decode`);
  }
  if (s.peak_memory_bytes) lines.push(`peak memory ${num(s.peak_memory_bytes / 2 ** 30)} GiB`);
  return { summary: s.summary || "", details: lines.join("\n") };
}

// Rows a text takes in a box `width` px wide at a monospace font whose characters are `charWidth` px
// wide: the lines, each wrapped (a summary line is longer than a node is wide).
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

const LINE_PX = 15;
export const MAX_ROWS = 20; // the box grows with its text up to this many rows, then scrolls: a node whose details
// are turned on grows by at most this much over the nodes around it

export function statsWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (widget) return widget;
  // the box is as tall as its text (wrapped at the node's width) up to MAX_ROWS, so it never squeezes the
  // prompt box and hides no line of a short text (a longer one scrolls): ComfyUI's frontend lays DOM widgets out by getMinHeight / getMaxHeight
  // (+ 30: the textarea sits 20 px inside its widget, plus its own padding and border)
  const height = () => LINE_PX * Math.min(MAX_ROWS, wrappedRows(widget?.value ?? "", (node.size?.[0] ?? 340) - 40)) + 30;
  if (typeof node.addDOMWidget === "function") {
    const el = document.createElement("textarea");
    el.readOnly = true;
    el.className = "comfy-multiline-input";
    Object.assign(el.style, { fontFamily: "monospace", fontSize: "11px", lineHeight: `${LINE_PX}px`, width: "100%",
      boxSizing: "border-box", resize: "none", overflowY: "auto" }); // width: Vue node rendering gives a textarea 20 columns otherwise
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

// What the box shows: a state line (`node.specarState`) or the last run's statistics, their details when
// the node's details toggle is on.
export function showStats(node) {
  const last = node.specarLast;
  const details = !!node.widgets?.find((w) => w.name === DETAILS_TOGGLE)?.value;
  let text = node.specarState ?? (last ? last.summary : IDLE_TEXT);
  if (!node.specarState && last?.details) {
    text += details ? "\n" + last.details : "\n(more: turn on \"statistics details\")";
  }
  const widget = statsWidget(node);
  if (widget.value === text) return;
  widget.value = text; // a DOM widget forwards this to the textarea (options.setValue)
  if (typeof node.computeSize === "function" && typeof node.setSize === "function") {
    const size = node.computeSize();
    node.setSize([Math.max(node.size[0], size[0]), Math.max(node.size[1], size[1])]);
  }
  node.setDirtyCanvas?.(true, true);
}

// A finished run's statistics (the node's `ui`: specar_stats JSON, or its text without the extension's JSON).
export function showResult(node, message) {
  const stats = message?.specar_stats?.[0];
  const text = message?.text?.[0];
  if (!stats && !text) return;
  const f = stats ? formatStats(stats) : { summary: text.split("\n")[0], details: text.split("\n").slice(1).join("\n") };
  node.specarLast = { ...f, backend: stats ? JSON.parse(stats).backend : null };
  node.specarState = null;
  node.specarRun = null;
  showStats(node);
}

function isNode(node, id) {
  return id !== null && id !== undefined && String(id) === String(node.id);
}

// One event of the execution for one sampler node: kind is the frontend API event's name, detail its
// payload. The box never keeps saying "running" once the execution is over, whatever ended it.
export function executionEvent(node, kind, detail) {
  const run = node.specarRun;
  if (kind === "execution_start") {
    node.specarRun = "waiting";
    node.specarState = "waiting to run...";
  } else if (kind === "executing") {
    const id = detail !== null && typeof detail === "object" ? detail.node ?? detail.display_node : detail;
    if (id === null || id === undefined) return executionEvent(node, "execution_end", detail);
    if (isNode(node, id) && run) {
      node.specarRun = "running";
      node.specarState = "running...";
    }
  } else if (kind === "specar_stage") {
    if (!isNode(node, detail?.node) || !run) return;
    node.specarState = detail.text || "running...";
  } else if (kind === "execution_error") {
    if (!run) return; // this node's run was over before the error: its statistics stand
    const why = String(detail?.exception_message ?? "").trim().split("\n")[0];
    const own = isNode(node, detail?.node_id);
    node.specarState = own ? `failed: ${why || "see ComfyUI's error message"}`
      : `not run: ${detail?.node_type ?? "another node"} (node ${detail?.node_id}) failed first${why ? `: ${why}` : ""}`;
    node.specarRun = null;
    if (!own) node.specarStalePreview = true; // a preview on the node is an earlier run's: specar.js removes it
  } else if (kind === "execution_interrupted") {
    if (!run) return;
    node.specarState = run === "running" ? "cancelled: the image below is the partial preview of the cancelled run"
      : "cancelled before this node ran";
    node.specarRun = null;
  } else if (kind === "execution_end" || kind === "execution_success") {
    if (!run) return;
    // still waiting when the execution ended: ComfyUI reused this node's cached result, the last statistics
    node.specarState = run === "running" ? "ended without statistics" : null;
    node.specarRun = null;
  } else {
    return;
  }
  showStats(node);
}

export const EXECUTION_EVENTS = ["execution_start", "executing", "execution_error", "execution_interrupted",
  "execution_success", "specar_stage"];
