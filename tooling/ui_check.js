// make test-ui: SpecAR's nodes in a real ComfyUI server and its own frontend, in headless Chromium, as an artist
// uses them. For one ComfyUI folder (made by ../shared/comfyui/setup.sh or any install with this pack in
// custom_nodes/):
//   node tooling/ui_check.js COMFYUI_DIR PORT OUT_DIR [--figures DIR]
// it starts the server (COMFYUI_DIR/.venv/bin/python, or COMFYUI_PYTHON; PYTHONPATH passes through), opens the
// frontend, loads both example workflows from the template browser, queues them and checks:
//   - no node is drawn over another (bounding boxes in px), with "statistics details" and "advanced inputs" on,
//     before, during (live preview on the node) and after a run;
//   - the statistics box after Cancel (says cancelled, and where the partial preview is) and after an upstream
//     failure (says which node failed; no stale preview left on the node);
//   - a first compiled run shows a compile stage with its own progress text (a tiny run: 4x4 tokens);
//   - the sampler shows "model default" for the model's own values (no -1 / 0) and backend inputs without prefix;
//   - the loader's lists are the values the chosen model allows (the server's specar_allowed), for the demo model
//     and a second model folder (a Janus config without weights: also the upstream failure);
//   - the GLM-Image example, from the template browser, on a tiny random-weight GLM-Image folder named as the
//     released one (tests/support/tiny_glm_image.py, run with the ComfyUI's Python), its size set to 256x256: the
//     loader's lists for it, a run to the end, no overlap.
// Writes PNG screenshots to OUT_DIR (and the docs figures to --figures), prints one line per failed check and
// exits 1 when any failed. Needs chromium and playwright-core (NODE_PATH).
"use strict";
let chromium;
try {
  ({ chromium } = require("playwright-core"));
} catch (e) {
  console.error("ui_check needs playwright-core: npm install playwright-core, then NODE_PATH=<its node_modules>");
  process.exit(2);
}
const { spawn, execSync } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const [dirArg, port, out] = process.argv.slice(2);
const dir = dirArg && path.resolve(dirArg); // the server runs in it: its .venv's python by an absolute path
const figIdx = process.argv.indexOf("--figures");
const figures = figIdx > 0 ? process.argv[figIdx + 1] : null;
if (!dir || !port || !out) {
  console.error("usage: node tooling/ui_check.js COMFYUI_DIR PORT OUT_DIR [--figures DIR]");
  process.exit(2);
}
const URL = `http://127.0.0.1:${port}`;
const failures = [];
const t0 = Date.now();
const secs = () => ((Date.now() - t0) / 1000).toFixed(0);
const log = (...a) => console.log(`[${secs()} s]`, ...a);
function check(ok, reason) {
  if (!ok) {
    failures.push(reason);
    log("FAIL:", reason);
  }
  return ok;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// UI_CHECK_STEPS: a comma-separated subset of demo,cancel,failure,compile,side,glm (while working on one of them)
const STEPS = new Set((process.env.UI_CHECK_STEPS || "demo,cancel,failure,compile,side,glm").split(","));
const GLM_SIZE = "256x256"; // GLM-Image's smallest listed size: 16x16 preview tokens, then 8x8

// ---------------------------------------------------------------------------------------------------------
// the server: the pack as installed in DIR/custom_nodes, plus a models/specar folder with a Janus config and no
// weights (listed by the loader; loading it fails at run time: the upstream failure) and, for the glm step, the
// tiny GLM-Image folder (GLM-Image, as the released folder's name: the example finds it)
function startServer() {
  const extra = fs.mkdtempSync(path.join(os.tmpdir(), "specar-ui-"));
  fs.mkdirSync(path.join(extra, "specar", "janus-no-weights"), { recursive: true });
  fs.writeFileSync(path.join(extra, "specar", "janus-no-weights", "config.json"), '{"model_type": "janus"}');
  fs.writeFileSync(path.join(extra, "paths.yaml"), `ui_check:\n  base_path: ${extra}\n  specar: specar\n`);
  // a fresh inductor cache: the compiled run compiles, as a first run on a new machine does
  const env = { OMP_NUM_THREADS: "1", ...process.env, TORCHINDUCTOR_CACHE_DIR: path.join(extra, "inductor") };
  const python = process.env.COMFYUI_PYTHON || path.join(dir, ".venv", "bin", "python");
  if (STEPS.has("glm")) {
    try {
      execSync(`"${python}" "${path.join(__dirname, "..", "tests", "support", "tiny_glm_image.py")}" "${path.join(extra, "specar")}" GLM-Image`,
        { env, stdio: ["ignore", "ignore", "pipe"] });
    } catch (e) { // transformers 4.x there, for one: GLM-Image cannot run on this ComfyUI (as tests/comfyui skips it)
      const why = String(e.stderr || e.message).trim().split("\n").pop();
      log(`note: the glm step is skipped: the tiny GLM-Image folder was not built with ${python}: ${why}`);
      STEPS.delete("glm");
    }
  }
  const logFile = path.join(out, "server.log");
  const fd = fs.openSync(logFile, "w");
  const proc = spawn(python, ["main.py", "--cpu", "--listen", "127.0.0.1", "--port", String(port),
    "--disable-auto-launch", "--extra-model-paths-config", path.join(extra, "paths.yaml")],
  { cwd: dir, stdio: ["ignore", fd, fd], env, detached: true });
  return { proc, logFile, extra };
}

async function waitForServer(server, timeoutS = 300) {
  for (let i = 0; i < timeoutS; i++) {
    if (server.proc.exitCode !== null) throw new Error(`ComfyUI exited (${server.proc.exitCode}): see ${server.logFile}`);
    try {
      const r = await fetch(`${URL}/object_info/SpecARSampler`);
      if (r.ok) return (await r.json()).SpecARSampler;
    } catch (e) { /* not up yet */ }
    await sleep(1000);
  }
  throw new Error(`ComfyUI did not answer on ${URL} in ${timeoutS} s: see ${server.logFile}`);
}

// ---------------------------------------------------------------------------------------------------------
// in the page

// Every node's box on the canvas (graph units = px at scale 1): [x, y, w, h] with the title bar, what the
// frontend draws. The frame of a node is its size; anything a node draws outside it (a DOM widget, a preview
// image) is measured by `spill` below.
const BOXES = `(() => {
  const g = window.app.graph, title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
  return g._nodes.map((n) => ({ id: n.id, type: n.type, title: n.title,
    box: [n.pos[0], n.pos[1] - title, n.size[0], n.size[1] + title] }));
})()`;

// How far each node's drawn content reaches below its frame, in graph px: DOM widgets (the statistics box, the
// prompt) from their elements' on-screen rectangles, the preview image from where the frontend draws it.
const SPILL = `(() => {
  const app = window.app, ds = app.canvas.ds, rect = app.canvas.canvas.getBoundingClientRect();
  const out = {};
  for (const n of app.graph._nodes) {
    let bottom = n.pos[1] + n.size[1];
    let reach = bottom;
    for (const w of n.widgets || []) {
      const el = w.element || w.inputEl;
      if (!el || !el.isConnected || el.offsetParent === null) continue;
      const r = el.getBoundingClientRect();
      if (r.height === 0) continue;
      reach = Math.max(reach, (r.bottom - rect.top) / ds.scale - ds.offset[1]);
    }
    for (const w of n.widgets || []) { // the preview widget of newer frontends: where it was last drawn
      if (!/image-preview|\\$\\$canvas-image-preview/.test(w.name || "")) continue;
      const y = (w.last_y ?? w.y ?? 0), h = w.computedHeight ?? 0;
      if (h) reach = Math.max(reach, n.pos[1] + y + h);
    }
    out[n.id] = Math.round(reach - bottom);
  }
  return out;
})()`;

function overlaps(boxes) {
  const found = [];
  for (let i = 0; i < boxes.length; i++) {
    for (let j = i + 1; j < boxes.length; j++) {
      const [ax, ay, aw, ah] = boxes[i].box, [bx, by, bw, bh] = boxes[j].box;
      const dx = Math.min(ax + aw, bx + bw) - Math.max(ax, bx), dy = Math.min(ay + ah, by + bh) - Math.max(ay, by);
      if (dx > 0 && dy > 0) found.push(`${boxes[i].title} (${boxes[i].id}) and ${boxes[j].title} (${boxes[j].id}) overlap by ${Math.round(dx)}x${Math.round(dy)} px`);
    }
  }
  return found;
}

async function checkLayout(page, when) {
  const boxes = await page.evaluate(BOXES);
  const spill = await page.evaluate(SPILL);
  for (const o of overlaps(boxes)) check(false, `${when}: ${o}`);
  for (const [id, px] of Object.entries(spill)) {
    const b = boxes.find((x) => String(x.id) === id);
    check(px <= 2, `${when}: ${b?.title} (${id}) draws ${px} px below its frame`);
  }
  return boxes;
}

// What the sampler shows an artist: "the model's own value" as a choice that says so (guidance and sampling "model
// default"), never a -1 / 0 to decode; a backend's inputs labelled by their own names, not "<backend>_window".
async function checkWidgets(page, when) {
  const nodes = await page.evaluate(() => window.app.graph._nodes.filter((n) => n.type === "SpecARSampler").map((n) => ({
    backend: n.widgets.find((w) => w.name === "backend")?.value,
    shown: n.widgets.filter((w) => !w.hidden && !w.options?.hidden && w.type !== "specar-hidden")
      .map((w) => ({ name: w.name, label: w.label || w.name, value: w.value })) })));
  for (const { backend, shown } of nodes) {
    const sentinels = shown.filter((w) => /temperature|top_p|cfg_scale|top_k/.test(w.name) && (w.value === -1 ||
      (/top_p/.test(w.name) && w.value === 0)));
    check(!sentinels.length, `${when}: the sampler shows ${JSON.stringify(sentinels)} for the model's own value`);
    for (const sw of ["guidance", "sampling"]) {
      check(shown.some((w) => w.name === sw && w.value === "model default"), `${when}: no "${sw}: model default" shown`);
    }
    const prefixed = shown.filter((w) => w.label.startsWith(`${backend}_`));
    check(!prefixed.length, `${when}: labels with the backend's prefix: ${prefixed.map((w) => w.label).join(", ")}`);
  }
}

async function command(page, id) {
  await page.evaluate((c) => window.app.extensionManager.command.execute(c), id);
}

// Open the template browser, pick the pack's category, click the template's card (as an artist does).
async function loadTemplate(page, title) {
  await command(page, "Comfy.BrowseTemplates");
  const dialog = page.locator("[role=dialog]").last();
  await dialog.waitFor({ timeout: 30000 });
  await dialog.getByText("specar", { exact: true }).first().click();
  const card = dialog.getByText(title, { exact: true }).first();
  await card.waitFor({ timeout: 30000 });
  await card.click();
  await page.waitForFunction((n) => window.app.graph._nodes.length === n && !document.querySelector("[role=dialog]"),
    title.includes("side by side") ? 26 : 5, { timeout: 60000 }).catch(() => {});
  await page.waitForTimeout(1500);
  return page.evaluate(() => window.app.graph._nodes.map((n) => n.type));
}

// The queue can be empty a moment before the frontend has the run's last events: wait for every sampler's box to
// leave its running states (up to 15 s).
const settled = (page) => page.waitForFunction(() => window.app.graph._nodes.filter((n) => n.type === "SpecARSampler")
  .every((n) => !/^(running|waiting|compiling)/.test(n.widgets.find((w) => w.name === "specar_stats_view")?.value || "")),
null, { timeout: 15000 }).catch(() => {});

const samplerState = (page) => page.evaluate(() => window.app.graph._nodes.filter((n) => n.type === "SpecARSampler")
  .map((n) => ({ id: n.id, title: n.title, box: n.widgets.find((w) => w.name === "specar_stats_view")?.value,
    imgs: (n.imgs || []).length, size: n.size.map(Math.round),
    progressText: n.widgets.find((w) => /text-preview/.test(w.name))?.value ?? null })));

async function setWidget(page, type, name, value) {
  await page.evaluate(([t, name, value]) => {
    for (const n of window.app.graph._nodes.filter((x) => x.type === t)) {
      const w = n.widgets.find((x) => x.name === name);
      if (!w) continue;
      w.value = value;
      w.callback?.(value, window.app.canvas, n);
    }
    window.app.graph.setDirtyCanvas(true, true);
  }, [type, name, value]);
}

// The whole graph at 80 % (the frontends draw text and widgets from about 60 %): the window grows to hold it.
const SCALE = 0.8;
async function fitView(page, again = true) {
  const bounds = await page.evaluate(() => {
    const nodes = window.app.graph._nodes, title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
    return [Math.min(...nodes.map((n) => n.pos[0])), Math.min(...nodes.map((n) => n.pos[1] - title)),
      Math.max(...nodes.map((n) => n.pos[0] + n.size[0])), Math.max(...nodes.map((n) => n.pos[1] + n.size[1]))];
  });
  const [x0, y0, x1, y1] = bounds;
  const width = Math.max(1200, Math.ceil((x1 - x0) * SCALE) + 140), height = Math.max(800, Math.ceil((y1 - y0) * SCALE) + 160);
  await page.setViewportSize({ width, height });
  await page.waitForTimeout(500);
  await page.evaluate(([x0, y0, s]) => {
    const c = window.app.canvas;
    c.ds.scale = s;
    c.ds.offset = [90 / s - x0, 100 / s - y0];
    c.setDirty(true, true);
  }, [x0, y0, SCALE]);
  await page.waitForTimeout(800);
  if (again) return fitView(page, false); // drawn at this size, a node may have grown (frontend 1.27): measured again
  return [Math.ceil((x1 - x0) * SCALE), Math.ceil((y1 - y0) * SCALE)];
}

async function shot(page, name) {
  const [w, h] = await fitView(page);
  const p = path.join(out, name);
  await page.screenshot({ path: p });
  log("screenshot", p);
  return [w, h];
}

// A docs figure: the graph alone (no menus, no minimap), from a fresh screenshot, copied to --figures.
// `until`: a node type; the figure ends below the lowest node of that type (the side-by-side's samplers).
async function figure(page, name, until = null) {
  await page.evaluate(() => window.app.extensionManager?.setting?.set?.("Comfy.Minimap.Visible", false)).catch(() => {});
  await page.evaluate(() => document.querySelectorAll(".p-toast, .p-toast-message").forEach((e) => e.remove()));
  let [w, h] = await fitView(page);
  if (until) {
    h = await page.evaluate(([t, s]) => {
      const nodes = window.app.graph._nodes, title = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
      const y0 = Math.min(...nodes.map((n) => n.pos[1] - title));
      return Math.ceil((Math.max(...nodes.filter((n) => n.type === t).map((n) => n.pos[1] + n.size[1])) - y0) * s);
    }, [until, SCALE]);
  }
  const p = path.join(out, name);
  await page.screenshot({ path: p, clip: { x: 80, y: 90, width: w + 20, height: h + 20 } });
  fs.copyFileSync(p, path.join(figures, name));
  log("figure", path.join(figures, name));
}

async function queue(page) {
  await command(page, "Comfy.QueuePrompt");
}

async function waitIdle(page, timeoutS) {
  const t = Date.now();
  await page.waitForTimeout(1500);
  while (Date.now() - t < timeoutS * 1000) {
    const q = await (await fetch(`${URL}/queue`)).json();
    if (!q.queue_running.length && !q.queue_pending.length) return true;
    await page.waitForTimeout(1000);
  }
  return false;
}

// ---------------------------------------------------------------------------------------------------------

async function main() {
  fs.mkdirSync(out, { recursive: true });
  const server = startServer();
  for (const signal of ["SIGINT", "SIGTERM"]) { // stopped (a timeout, Ctrl-C): the server goes too
    process.on(signal, () => {
      try { process.kill(-server.proc.pid, "SIGTERM"); } catch (e) { /* gone */ }
      fs.rmSync(server.extra, { recursive: true, force: true });
      process.exit(1);
    });
  }
  let browser;
  try {
    const def = await waitForServer(server);
    log("server up");
    const loaderDef = (await (await fetch(`${URL}/object_info/SpecARModelLoader`)).json()).SpecARModelLoader;
    const allowed = loaderDef.input.required.model[1].specar_allowed || {};
    const exe = process.env.CHROMIUM || execSync("command -v chromium || command -v chromium-browser").toString().trim();
    browser = await chromium.launch({ executablePath: exe, args: ["--no-sandbox"] });
    const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
    // a page error once the frontend is ready fails the check (whichever script throws: the pack's state can make
    // the frontend's own code throw); one while it starts is the frontend's own, logged
    let ready = false;
    page.on("pageerror", (e) => {
      const what = `${String(e).split("\n")[0]} at ${(e.stack || "").split("\n").slice(1, 3).join(" ").trim()}`;
      if (ready) check(false, `page error: ${what}`);
      else log(`note: a page error while the frontend starts: ${what}`);
    });
    await page.goto(URL);
    await page.waitForFunction(() => window.app?.graph && window.app.extensionManager?.command, null, { timeout: 120000 });
    await page.waitForTimeout(2000);
    ready = true;
    const version = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ ?? "?");
    log("frontend", version);

    // 1. the demo example, from the template browser
    const demoTypes = await loadTemplate(page, "SpecAR demo - auto");
    check(demoTypes.includes("SpecARSampler") && demoTypes.includes("SpecARModelLoader"),
      `the template browser did not load "SpecAR demo - auto" (nodes: ${demoTypes.join(", ")})`);
    // the loader's lists: what the chosen model allows, for the demo model and a second one
    for (const model of ["demo", "janus-no-weights"]) {
      if (!check(allowed[model], `the loader offers no allowed values for ${model}`)) continue;
      await setWidget(page, "SpecARModelLoader", "model", model);
      const lists = await page.evaluate(() => {
        const n = window.app.graph._nodes.find((x) => x.type === "SpecARModelLoader");
        return Object.fromEntries(n.widgets.map((w) => [w.name, { value: w.value, values: w.options?.values }]));
      });
      for (const [name, values] of Object.entries(allowed[model])) {
        const w = lists[name];
        check(w && JSON.stringify(w.values) === JSON.stringify(values),
          `loader with ${model}: ${name} offers ${JSON.stringify(w?.values)}, the model allows ${JSON.stringify(values)}`);
        check(w && values.includes(w.value), `loader with ${model}: ${name} is ${JSON.stringify(w?.value)}, not one of ${values}`);
      }
    }
    await setWidget(page, "SpecARModelLoader", "model", "demo");
    await checkWidgets(page, "demo loaded");
    await setWidget(page, "SpecARSampler", "statistics details", true);
    await setWidget(page, "SpecARSampler", "advanced inputs", true);
    await checkLayout(page, "demo loaded, details and advanced inputs on");

    // a run, measured during (the live preview) and after
    if (STEPS.has("demo")) {
    await queue(page);
    let sawPreview = false;
    for (let i = 0; i < 120; i++) {
      await page.waitForTimeout(500);
      const s = await samplerState(page);
      if (s.some((x) => x.imgs > 0) && s.some((x) => /running/.test(x.box || ""))) {
        sawPreview = true;
        await checkLayout(page, "demo during a run (live preview)");
        await shot(page, "demo_running.png");
        break;
      }
      if (!(await (await fetch(`${URL}/queue`)).json()).queue_running.length) break;
    }
    check(await waitIdle(page, 600), "the demo run did not finish in 600 s");
    if (!sawPreview) log("note: the run ended before a live preview was seen");
    await settled(page);
    const done = await samplerState(page);
    check(done.every((s) => /tokens in/.test(s.box || "")), `after the demo run the statistics box says: ${done.map((s) => s.box?.split("\n")[0])}`);
    await checkLayout(page, "demo after a run, details and advanced inputs on");
    await shot(page, "demo_after_run_details.png");
    if (figures) {
      await setWidget(page, "SpecARSampler", "advanced inputs", false);
      await setWidget(page, "SpecARSampler", "statistics details", false);
      await figure(page, "comfyui_demo_after_run.png");
    }
    }

    if (STEPS.has("cancel")) {
    // 2. Cancel during a run: the box says cancelled and where the partial preview is
    await setWidget(page, "SpecARSampler", "seed", 12345);
    await queue(page);
    await page.waitForFunction(() => window.app.graph._nodes.some((n) => n.type === "SpecARSampler" && (n.imgs || []).length
      && /running/.test(n.widgets.find((w) => w.name === "specar_stats_view")?.value || "")), null, { timeout: 120000 }).catch(() => {});
    await command(page, "Comfy.Interrupt");
    await waitIdle(page, 120);
    await page.waitForTimeout(1000);
    const cancelled = await samplerState(page);
    for (const s of cancelled) {
      check(/^cancelled/.test(s.box || ""), `after Cancel the box says: ${JSON.stringify(s.box)}`);
      if (s.imgs) check(/below/.test(s.box || "") && !/above/.test(s.box || ""), `after Cancel with the partial preview below the box, it says: ${JSON.stringify(s.box)}`);
    }
    await checkLayout(page, "after Cancel");
    await shot(page, "demo_cancelled.png");
    }

    if (STEPS.has("failure")) {
    // 3. an upstream failure: the loader fails (a model folder without weights); the sampler says so and keeps no
    // stale partial preview of the cancelled run
    await setWidget(page, "SpecARModelLoader", "model", "janus-no-weights");
    await queue(page);
    await waitIdle(page, 120);
    await page.waitForTimeout(1000);
    await page.keyboard.press("Escape"); // the error dialog
    for (const s of await samplerState(page)) {
      check(/^not run: .*SpecARModelLoader|^not run: .*Model Loader/.test(s.box || ""), `after the loader failed the box says: ${JSON.stringify(s.box)}`);
      check(s.imgs === 0, `after the loader failed the sampler still shows ${s.imgs} preview image(s) of an earlier run`);
    }
    await shot(page, "demo_upstream_failure.png");
    await setWidget(page, "SpecARModelLoader", "model", "demo");
    }

    if (STEPS.has("compile")) {
    // 4. a first compiled run (tiny: the demo model's 4x4 tokens, backend sjd): a compile stage with its own text
    await setWidget(page, "SpecARSampler", "backend", "sjd");
    await setWidget(page, "SpecARSampler", "compile", true);
    await setWidget(page, "SpecARSampler", "compare_with_ar", false);
    await queue(page);
    const stages = new Set();
    const started = Date.now();
    let stageShot = false;
    while (Date.now() - started < 600000) {
      await page.waitForTimeout(700);
      for (const s of await samplerState(page)) {
        if (/^compiling/.test(s.box || "")) {
          stages.add(s.box);
          if (!stageShot) {
            stageShot = true;
            await shot(page, "demo_compiling.png");
          }
        }
      }
      if (!(await (await fetch(`${URL}/queue`)).json()).queue_running.length) break;
    }
    check(stages.size > 0, "a first compiled run showed no compile stage in the statistics box");
    check(stages.size > 1, `the compile stage's text did not count its seconds (${[...stages].join(" | ")})`);
    log("compile stage texts:", [...stages].slice(0, 3).join(" | "), stages.size > 3 ? `... (${stages.size})` : "");
    await settled(page);
    const compiled = await samplerState(page);
    check(compiled.every((s) => /tokens in/.test(s.box || "")), `after the compiled run the box says: ${compiled.map((s) => s.box)}`);
    for (const s of compiled) {
      check(!/compiling/.test(s.progressText || ""), `after the compiled run ComfyUI's progress text still says ${JSON.stringify(s.progressText)}`);
    }
    await shot(page, "demo_compiled.png");
    }

    if (STEPS.has("side")) {
    // 5. every backend side by side, from the template browser: run, no overlap with details and advanced on
    const sideTypes = await loadTemplate(page, "SpecAR - every backend side by side");
    check(sideTypes.filter((t) => t === "SpecARSampler").length >= 8,
      `the template browser did not load "SpecAR - every backend side by side" (${sideTypes.length} nodes)`);
    await setWidget(page, "SpecARSampler", "statistics details", true);
    await setWidget(page, "SpecARSampler", "advanced inputs", true);
    await checkLayout(page, "side by side loaded, details and advanced inputs on");
    await queue(page);
    let sideDuring = false;
    const sideStart = Date.now();
    while (Date.now() - sideStart < 900000) {
      await page.waitForTimeout(1000);
      const s = await samplerState(page);
      if (!sideDuring && s.some((x) => x.imgs > 0 && /running/.test(x.box || ""))) {
        sideDuring = true;
        await checkLayout(page, "side by side during a run (live preview)");
      }
      if (!(await (await fetch(`${URL}/queue`)).json()).queue_running.length) break;
    }
    await settled(page);
    const side = await samplerState(page);
    log("sampler sizes, details and advanced inputs on:", side.map((s) => `${s.title} ${s.size.join("x")}`).join(", "));
    check(side.every((s) => /tokens in/.test(s.box || "")), `after the side-by-side run: ${side.filter((s) => !/tokens in/.test(s.box || "")).map((s) => `${s.title}: ${s.box}`).join("; ")}`);
    await checkLayout(page, "side by side after a run, details and advanced inputs on");
    await shot(page, "side_by_side_after_run_details.png");
    if (figures) {
      await setWidget(page, "SpecARSampler", "advanced inputs", false);
      await setWidget(page, "SpecARSampler", "statistics details", false);
      await figure(page, "comfyui_side_by_side_after_run.png", "SpecARSampler");
    }
    }

    if (STEPS.has("glm")) {
    // 6. the GLM-Image example, from the template browser, on the tiny folder; the size set small, as an artist
    // picks one from the loader's list (the example's 1024x1024 is 1,280 tokens: minutes on a CPU)
    const glmTypes = await loadTemplate(page, "SpecAR - GLM-Image");
    check(glmTypes.includes("SpecARSampler") && glmTypes.includes("SpecARModelLoader"),
      `the template browser did not load "SpecAR - GLM-Image" (nodes: ${glmTypes.join(", ")})`);
    const glmLoader = () => page.evaluate(() => {
      const n = window.app.graph._nodes.find((x) => x.type === "SpecARModelLoader");
      return Object.fromEntries(n.widgets.map((w) => [w.name, { value: w.value, values: w.options?.values }]));
    });
    const glmAllowed = allowed["GLM-Image"];
    if (check(glmAllowed, "the loader offers no allowed values for GLM-Image (the tiny folder)")) {
      const lists = await glmLoader();
      check(lists.model?.value === "GLM-Image", `the GLM-Image example's loader has model ${JSON.stringify(lists.model?.value)}`);
      check(JSON.stringify(lists.resolution?.values) === JSON.stringify(glmAllowed.resolution),
        `loader with GLM-Image: resolution offers ${JSON.stringify(lists.resolution?.values)}, the model allows ${JSON.stringify(glmAllowed.resolution)}`);
      check(glmAllowed.resolution.includes(GLM_SIZE) && !glmAllowed.resolution.includes("720x720"),
        `GLM-Image's sizes: ${glmAllowed.resolution}`);
    }
    await setWidget(page, "SpecARModelLoader", "resolution", GLM_SIZE);
    check((await glmLoader()).resolution?.value === GLM_SIZE, `the GLM-Image loader's resolution did not take ${GLM_SIZE}`);
    await setWidget(page, "SpecARSampler", "statistics details", true);
    await setWidget(page, "SpecARSampler", "advanced inputs", true);
    await checkLayout(page, "GLM-Image loaded, details and advanced inputs on");
    await queue(page);
    check(await waitIdle(page, 300), "the GLM-Image run did not finish in 300 s");
    await settled(page);
    const glm = await samplerState(page);
    check(glm.length === 1 && glm.every((s) => /tokens in/.test(s.box || "")),
      `after the GLM-Image run the statistics box says: ${glm.map((s) => s.box?.split("\n")[0])}`);
    const history = await (await fetch(`${URL}/history?max_items=1`)).json();
    const last = Object.values(history)[0];
    check(last?.status?.status_str === "success", `the GLM-Image run ended with ${JSON.stringify(last?.status?.status_str)}`);
    check(Object.values(last?.outputs || {}).some((o) => (o.images || []).some((i) => i.type === "output")),
      "the GLM-Image run saved no image");
    await page.waitForTimeout(1500); // the finished image drawn on the sampler (frontend 1.27 grows the node then)
    await checkLayout(page, "GLM-Image after a run, details and advanced inputs on");
    await shot(page, "glm_image_after_run_details.png");
    }
  } catch (e) {
    check(false, `the check stopped: ${String(e.message || e).split("\n")[0]}`);
  } finally {
    if (browser) await browser.close();
    try { process.kill(-server.proc.pid, "SIGTERM"); } catch (e) { /* gone */ }
    fs.rmSync(server.extra, { recursive: true, force: true });
  }
  log(`${failures.length} failed check(s) in ${secs()} s`);
  for (const f of failures) console.log("FAILED:", f);
  process.exit(failures.length ? 1 : 0);
}

main();
