"""Opt-in: screenshot SpecAR's nodes in the real ComfyUI frontend with headless Chromium.

Not collected by pytest (no test functions). It opens the ComfyUI frontend of a running server (or
starts one from SPECAR_COMFYUI with SPECAR_COMFYUI_PYTHON, with this pack on its custom nodes path,
as tests/test_nodes_comfyui.py::test_real_comfyui_server does), loads a UI-format workflow through the
frontend's own ``app.loadGraphData`` and saves a PNG of the page (the graph canvas), or of one node
with ``--node``. It drives Chromium over the DevTools protocol with a minimal websocket client
written on the Python standard library, so it needs no package beyond a Chromium binary
(Debian: ``apt-get install chromium-headless-shell`` or ``chromium``)::

    python tooling/screenshot_nodes.py --url http://127.0.0.1:8190 \
        --node SpecARSampler --out docs/figures/node_sampler.png
    SPECAR_COMFYUI=/path/to/ComfyUI SPECAR_COMFYUI_PYTHON=/path/to/venv/bin/python \
        python tooling/screenshot_nodes.py --out docs/figures/specar_demo_graph.png
"""
import argparse
import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUMS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell")


class WebSocket:
    """Just enough RFC 6455 for the DevTools protocol: client handshake, masked text frames out,
    unfragmented or fragmented text frames in, ping answered."""

    def __init__(self, url, timeout=60):
        u = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {u.path or '/'} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake failed: {head[:200]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send(self, text):
        self._send_frame(0x1, text.encode())

    def recv(self):
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket closed by peer")
            if opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self):
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


class DevTools:
    def __init__(self, ws_url):
        self.ws = WebSocket(ws_url)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression, timeout=60):
        r = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
                      timeout=timeout * 1000)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page JS failed: {r['exceptionDetails'].get('exception', r['exceptionDetails'])}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression, timeout=120, what=None):
        deadline = time.time() + timeout
        while True:
            try:
                if self.js(expression):
                    return
            except RuntimeError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"timed out waiting for {what or expression}")
            time.sleep(0.5)


def find_chromium(explicit=None):
    for name in ([explicit] if explicit else []) + list(CHROMIUMS):
        path = shutil.which(name) or (name if name and os.path.isfile(name) else None)
        if path:
            return path
    raise SystemExit("no Chromium found: apt-get install chromium-headless-shell (or chromium), or pass --chromium")


def stop_group(proc):
    """Stop a process started with start_new_session=True, and everything in its process group."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        for _ in range(25):  # the group's other members exit right after the leader
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def start_chromium(binary, width, height):
    profile = tempfile.mkdtemp(prefix="specar-chromium-")
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-dev-shm-usage", f"--window-size={width},{height}", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", "about:blank"]
    # its own process group: Debian's /usr/bin/chromium* are shell wrappers, and the browser has helpers
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    port_file = os.path.join(profile, "DevToolsActivePort")
    deadline = time.time() + 60
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"Chromium did not start ({binary})")
        time.sleep(0.2)
    port = int(open(port_file).read().split()[0])
    return proc, profile, port


def start_comfyui(comfy_dir, python, workdir):
    """Start ComfyUI on a free loopback port with this pack on its custom nodes path."""
    nodes_dir = os.path.join(workdir, "custom_nodes")
    os.makedirs(nodes_dir, exist_ok=True)
    os.makedirs(os.path.join(workdir, "user"), exist_ok=True)  # ComfyUI wants --user-directory to exist
    os.symlink(ROOT, os.path.join(nodes_dir, "specar"))
    config = os.path.join(workdir, "extra_model_paths.yaml")
    with open(config, "w") as f:
        f.write(f"specar_screenshot:\n  base_path: {workdir}\n  custom_nodes: custom_nodes\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(workdir, "server.log"), "w")
    # SPECAR_COMFYUI_ARGS: more server arguments, e.g. "--front-end-root DIR" for the frontend release an
    # older ComfyUI shipped with
    extra = os.environ.get("SPECAR_COMFYUI_ARGS", "").split()
    proc = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                             "--extra-model-paths-config", config, "--disable-auto-launch",
                             "--output-directory", os.path.join(workdir, "output"), "--temp-directory", workdir,
                             "--user-directory", os.path.join(workdir, "user")] + extra,
                            cwd=comfy_dir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(url + "/object_info", timeout=10).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit("ComfyUI did not start; log: " + os.path.join(workdir, "server.log"))
            time.sleep(1)


def post_setting(url, key, value):
    req = urllib.request.Request(f"{url}/api/settings/{urllib.parse.quote(key)}", data=json.dumps(value).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        urllib.request.urlopen(req, timeout=10).read()
    except OSError:
        pass  # a setting the server does not know only means a dialog may show


FIT_AND_CLIP = r"""
(async () => {
  const app = window.app;
  const nodeType = %(node)s;
  const pad = %(pad)d;
  const canvasEl = app.canvas.canvas;
  const cr = canvasEl.getBoundingClientRect();
  let nodes = app.graph._nodes || app.graph.nodes;
  if (nodeType) nodes = nodes.filter(n => n.type === nodeType || n.comfyClass === nodeType);
  if (!nodes.length) throw new Error("no node of type " + nodeType);
  // bounding box in graph coordinates, title bar included
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  for (const n of nodes) {
    const b = n.boundingRect || [n.pos[0], n.pos[1] - 30, n.size[0], n.size[1] + 30];
    x0 = Math.min(x0, b[0]); y0 = Math.min(y0, b[1]);
    x1 = Math.max(x1, b[0] + b[2]); y1 = Math.max(y1, b[1] + b[3]);
  }
  const ds = app.canvas.ds;
  const top = 120;  // the frontend's menu and tab bars lie over the top of the canvas
  const scale = Math.min(%(maxscale)f, (cr.width - 2 * pad) / (x1 - x0), (cr.height - top - 2 * pad) / (y1 - y0));
  ds.scale = scale;
  ds.offset[0] = (cr.width - scale * (x1 - x0)) / 2 / scale - x0;
  ds.offset[1] = (top + (cr.height - top - scale * (y1 - y0)) / 2) / scale - y0;
  app.canvas.setDirty(true, true);
  app.canvas.draw(true, true);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  await new Promise(r => setTimeout(r, 500));
  const p0 = ds.convertOffsetToCanvas([x0, y0]), p1 = ds.convertOffsetToCanvas([x1, y1]);
  const badge = 16;  // the node source badge ("specar") sits above the title bar
  return {x: cr.left + p0[0] - pad / 2, y: cr.top + p0[1] - pad / 2 - badge,
          width: p1[0] - p0[0] + pad, height: p1[1] - p0[1] + pad + badge, scale};
})()
"""


SET_WIDGETS = r"""
(async () => {
  // set widgets by name on the nodes of one type, as a user would: the value, then the widget's callback
  // (a DynamicCombo's callback swaps in the chosen option's inputs; set those after their switch)
  const nodes = (app.graph._nodes || app.graph.nodes).filter(n => n.type === %(node)s || n.comfyClass === %(node)s);
  if (!nodes.length) throw new Error("no node of type " + %(node)s);
  for (const [name, raw] of %(sets)s) {
    for (const n of nodes) {
      const w = (n.widgets || []).find(w => w.name === name);
      if (!w) throw new Error("no widget " + name + " on " + n.type + "; it has " + n.widgets.map(w => w.name));
      const value = typeof w.value === "number" ? Number(raw) : typeof w.value === "boolean" ? raw === "true" : raw;
      w.value = value;
      w.callback?.(value, app.canvas, n);
      await new Promise(r => setTimeout(r, 100));
    }
  }
  app.canvas.setDirty(true, true);
  return true;
})()
"""

READ_GRAPH = r"""
(async () => {
  // what the frontend shows (widget values by name, node properties) and the API prompt it would queue
  const nodes = {};
  for (const n of app.graph._nodes || app.graph.nodes) {
    nodes[n.id] = {type: n.type, title: n.title, properties: n.properties, pos: [...n.pos], size: [...n.size],
                   widgets: Object.fromEntries((n.widgets || []).filter(w => w.serialize !== false)
                                               .map(w => [w.name, w.value]))};
  }
  const p = await app.graphToPrompt();
  return {nodes, prompt: p.output, frontend_version: window.__COMFYUI_FRONTEND_VERSION__ || null};
})()
"""


class Frontend:
    """The ComfyUI frontend of a running server in headless Chromium, driven over DevTools."""

    def __init__(self, url, chromium=None, width=1600, height=1200):
        self.url = url.rstrip("/")
        # keep first-run dialogs (template browser, tutorial) out of the picture
        for key, value in (("Comfy.TutorialCompleted", True), ("Comfy.Workflow.ShowMissingNodesWarning", False),
                           ("Comfy.Workflow.ShowMissingModelsWarning", False)):
            post_setting(self.url, key, value)
        self.proc, self.profile, port = start_chromium(find_chromium(chromium), width, height)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next(t for t in json.loads(r.read()) if t["type"] == "page")
            self.dt = DevTools(page["webSocketDebuggerUrl"])
            self.dt.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                         mobile=False)
            self.dt.call("Page.enable")
            self.dt.call("Page.navigate", url=self.url)
            self.dt.wait_for("!!(window.app && window.app.graph && window.app.canvas && window.app.canvas.canvas)",
                             what="the ComfyUI frontend (window.app)")
            self.dt.wait_for("!!(window.LiteGraph && LiteGraph.registered_node_types && "
                             "LiteGraph.registered_node_types['SpecARSampler'])", what="SpecAR's node definitions")
            time.sleep(1.0)
            self.dt.js("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'})); true")
            # the minimap lies over the bottom right of the canvas: hidden in this page only (no setting saved)
            self.dt.js("(() => { const s = document.createElement('style'); "
                       "s.textContent = '.minimap-main-container { display: none !important; }'; "
                       "document.head.appendChild(s); return true; })()")
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if getattr(self, "dt", None) is not None:
            self.dt.ws.close()
            self.dt = None
        stop_group(self.proc)
        for _ in range(20):  # Chromium's helper processes may still be writing to the profile for a moment
            shutil.rmtree(self.profile, ignore_errors=True)
            if not os.path.exists(self.profile):
                break
            time.sleep(0.25)

    def load(self, graph):
        """Load a UI-format workflow (dict) through the frontend's own app.loadGraphData."""
        self.dt.js(f"window.app.loadGraphData({json.dumps(graph)}).then(() => true)")
        time.sleep(1.5)
        self.close_popups()

    def create(self, node_type):
        """An empty graph with one new node at its defaults."""
        self.dt.js("(async () => { app.graph.clear(); const n = LiteGraph.createNode(%s); n.pos = [100, 100]; "
                   "app.graph.add(n); return true; })()" % json.dumps(node_type))
        time.sleep(1.5)

    def close_popups(self):
        # close anything the frontend popped up over the canvas (dialogs, toasts)
        self.dt.js("document.querySelectorAll('.p-dialog-close-button, .p-toast-close-button')"
                   ".forEach(b => b.click()); true")
        time.sleep(0.5)

    def set_widgets(self, node_type, sets):
        """sets: [(widget name, value as text)], applied in order to every node of node_type."""
        self.dt.js(SET_WIDGETS % {"node": json.dumps(node_type), "sets": json.dumps(list(sets))})
        time.sleep(0.5)

    def read(self):
        """{"nodes": {id: {type, title, properties, widgets}}, "prompt": the API prompt, "frontend_version"}."""
        return self.dt.js(READ_GRAPH)

    def run(self, timeout=600):
        """Queue the graph as the Run button does and wait until the server's queue is empty again."""
        before = json.loads(urllib.request.urlopen(self.url + "/history", timeout=10).read())
        self.dt.js("window.app.queuePrompt(0, 1).then(() => true)")
        deadline = time.time() + timeout
        while True:
            time.sleep(1)
            q = json.loads(urllib.request.urlopen(self.url + "/queue", timeout=10).read())
            if not q["queue_running"] and not q["queue_pending"]:
                break
            if time.time() > deadline:
                raise TimeoutError("the queued workflow did not finish")
        time.sleep(1.5)  # the executed messages reach the nodes over the websocket
        hist = json.loads(urllib.request.urlopen(self.url + "/history", timeout=10).read())
        new = [v for k, v in hist.items() if k not in before]
        return new[-1] if new else None

    def shoot(self, out, node=None, max_scale=1.0, pad=24):
        clip = self.dt.js(FIT_AND_CLIP % {"node": json.dumps(node), "pad": pad, "maxscale": max_scale})
        shot = self.dt.call("Page.captureScreenshot", format="png",
                            clip={**{k: clip[k] for k in ("x", "y", "width", "height")}, "scale": 1})
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return clip


def screenshot(url, workflow, out, node=None, chromium=None, width=1600, height=1200, max_scale=1.0, pad=24,
               create=False, sets=(), run=False, read_out=None):
    if create and not node:
        raise SystemExit("--create needs --node")
    if sets and not node:
        raise SystemExit("--set needs --node")
    graph = None
    if not create:
        with open(workflow) as f:
            graph = json.load(f)
    with Frontend(url, chromium, width, height) as fe:
        if create:  # a fresh node at its defaults, on an empty graph
            fe.create(node)
        else:
            fe.load(graph)
        if sets:
            fe.set_widgets(node, sets)
        result = None
        if run:
            result = fe.run()
            if result is None or result["status"]["status_str"] != "success":
                raise SystemExit(f"the run failed: {json.dumps(result and result['status'])[:2000]}")
        if read_out:
            state = fe.read()
            if result is not None:
                state["run"] = {"status": result["status"]["status_str"], "outputs": result["outputs"]}
            with open(read_out, "w") as f:
                json.dump(state, f, indent=1)
        return fe.shoot(out, node=node, max_scale=max_scale, pad=pad)


def default_workflow():
    folder = os.path.join(ROOT, "example_workflows")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    demo = [n for n in names if "demo" in n.lower()]
    return os.path.join(folder, (demo or names)[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("SPECAR_COMFYUI_URL"),
                    help="a running ComfyUI server with SpecAR loaded; without it one is started from SPECAR_COMFYUI")
    ap.add_argument("--workflow", default=default_workflow(), help="a UI-format workflow (default: the demo)")
    ap.add_argument("--node", default=None, help="clip to the nodes of this type (e.g. SpecARSampler)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "figures", "specar_demo_graph.png"))
    ap.add_argument("--create", action="store_true",
                    help="instead of loading the workflow, shoot a new --node at its default values")
    ap.add_argument("--chromium", default=os.environ.get("SPECAR_CHROMIUM"))
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1200)
    ap.add_argument("--max-scale", type=float, default=1.0, help="largest canvas zoom used to fit the nodes")
    ap.add_argument("--set", action="append", default=[], metavar="WIDGET=VALUE",
                    help="set a widget of the --node nodes as a user would (value, then its callback: a "
                         "DynamicCombo swaps in the option's inputs), e.g. --set backend=hawk; repeatable, in order")
    ap.add_argument("--run", action="store_true",
                    help="queue the workflow (as the Run button does), wait for it, then shoot (stats on the node)")
    ap.add_argument("--read", default=None, metavar="FILE",
                    help="write what the frontend shows (widget values by name) and the API prompt it would "
                         "queue (app.graphToPrompt) to FILE as JSON")
    args = ap.parse_args(argv)
    sets = []
    for item in args.set:
        if "=" not in item:
            raise SystemExit(f"--set wants WIDGET=VALUE, got {item!r}")
        sets.append(tuple(item.split("=", 1)))
    server, workdir = None, None
    url = args.url
    if not url:
        comfy = os.environ.get("SPECAR_COMFYUI")
        if not comfy:
            raise SystemExit("give --url of a running server, or set SPECAR_COMFYUI (and SPECAR_COMFYUI_PYTHON)")
        workdir = tempfile.mkdtemp(prefix="specar-comfy-")
        server, url = start_comfyui(comfy, os.environ.get("SPECAR_COMFYUI_PYTHON", sys.executable), workdir)
    try:
        clip = screenshot(url.rstrip("/"), args.workflow, args.out, node=args.node, chromium=args.chromium,
                          width=args.width, height=args.height, max_scale=args.max_scale, create=args.create,
                          sets=sets, run=args.run, read_out=args.read)
        print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {clip['width']:.0f}x{clip['height']:.0f} px, "
              f"zoom {clip['scale']:.2f})")
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
