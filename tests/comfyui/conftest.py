"""A real ComfyUI server with this pack, shared by the tests of tests/comfyui/ (`make test-comfyui`).

Where ComfyUI is: COMFYUI_DIR, a folder made by ../shared/comfyui/setup.sh (ComfyUI, its .venv, the pack in
custom_nodes/specar as a user installs it), or COMFYUI_VERSION (0.3.64, 0.33.0; FRONTEND=<version>
for another web frontend), for which setup.sh makes output/comfyui-<version>[-frontend-<version>] in this checkout first (COMFYUI_SHARED: the folder of setup.sh, default
../shared/comfyui). Neither given: every test is skipped, with one line saying so.

The server runs on 127.0.0.1 (COMFYUI_PORT, default a free port), CPU only, with its output, temp and model
and input folders in a temporary folder: models/specar holds a tiny GLM-Image folder named GLM-Image (when this
Python's transformers can build one: tests/support/tiny_glm_image.py, with sampling values of its own) and a broken copy
of it; models/specar_drafters a drafter folder whose drafter.json has no format; the input folder a small PNG
(REFERENCE) for LoadImage.
The tests talk to it over HTTP and its websocket (stdlib only).
"""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("COMFYUI_SHARED") or os.path.join(os.path.dirname(ROOT), "shared", "comfyui")
START_TIMEOUT = 300
GLM_IMAGE = "GLM-Image"  # the tiny GLM-Image folder's name in models/specar
REFERENCE = "specar_reference.png"  # in the server's input folder: a reference image for image-to-image


def comfyui_dir():
    """The ComfyUI folder to test, made by setup.sh when only COMFYUI_VERSION is given; None: none given."""
    if os.environ.get("COMFYUI_DIR"):
        return os.path.abspath(os.environ["COMFYUI_DIR"])
    version = os.environ.get("COMFYUI_VERSION")
    if not version:
        return None
    frontend = os.environ.get("FRONTEND")  # setup.sh's: that web frontend instead of the release's
    dest = os.path.join(ROOT, "output", f"comfyui-{version}" + (f"-frontend-{frontend}" if frontend else ""))
    subprocess.run([os.path.join(SHARED, "setup.sh"), version, dest, ROOT], check=True)
    return dest


class WebSocket:
    """The server's /ws?clientId= stream, read with the standard library: JSON text messages (binary preview
    frames are counted, not kept)."""

    def __init__(self, port: int, client_id: str):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.binary_frames = 0

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("websocket closed")
            out += chunk
        return out

    def next(self, timeout: float):
        """The next JSON message, or None after `timeout` seconds without one."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.sock.settimeout(max(0.1, deadline - time.time()))
            try:
                b0, b1 = self._exact(2)
            except socket.timeout:
                return None
            self.sock.settimeout(60)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = b0 & 0x0F
            if opcode == 1:
                return json.loads(payload)
            if opcode == 2:
                self.binary_frames += 1
            elif opcode == 8:
                raise ConnectionError("websocket closed by the server")
        return None

    def close(self):
        self.sock.close()


class Server:
    """HTTP helpers on the running server."""

    def __init__(self, url, port, proc, log_path, tmp):
        self.url, self.port, self.proc, self.log_path, self.tmp = url, port, proc, log_path, tmp
        self.client_id = uuid.uuid4().hex
        self.ws = None

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return json.loads(r.read())

    def get_bytes(self, path) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.read()

    def post(self, path, body=None):
        """(HTTP status, JSON answer or None)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                text = r.read()
                return r.status, (json.loads(text) if text.strip() else None)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def queue(self, prompt):
        """POST /prompt: (status, answer)."""
        return self.post("/prompt", {"prompt": prompt, "client_id": self.client_id})

    def events(self):
        if self.ws is None:
            self.ws = WebSocket(self.port, self.client_id)
        return self.ws

    def run(self, prompt, timeout=600, on_event=None):
        """Queue `prompt` and follow it on the websocket to its end: (history entry, [events of this prompt])."""
        ws = self.events()
        status, answer = self.queue(prompt)
        assert status == 200, answer
        pid = answer["prompt_id"]
        seen, deadline = [], time.time() + timeout
        while time.time() < deadline:
            msg = ws.next(timeout=5)
            if msg is not None and (msg.get("data") or {}).get("prompt_id") == pid:
                seen.append(msg)
                if on_event is not None:
                    on_event(msg)
                if msg["type"] in ("execution_success", "execution_error", "execution_interrupted"):
                    break
            assert self.proc.poll() is None, self.log()[-3000:]
        else:
            raise AssertionError(f"prompt {pid} still running after {timeout} s")
        for _ in range(50):  # the history entry is written right after the last event
            hist = self.get(f"/history/{pid}")
            if pid in hist:
                return hist[pid], seen
            time.sleep(0.2)
        raise AssertionError(f"no history for {pid}")

    def image_pixels(self, ref: dict) -> bytes:
        """An output image's pixels (RGB bytes), read with PIL from /view."""
        import io

        from PIL import Image
        q = urllib.parse.urlencode({"filename": ref["filename"], "subfolder": ref.get("subfolder", ""),
                                    "type": ref.get("type", "output")})
        with Image.open(io.BytesIO(self.get_bytes(f"/view?{q}"))) as im:
            return im.convert("RGB").tobytes()

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) / 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model_folders(tmp):
    """models/specar and models/specar_drafters for the server (see the module's help)."""
    specar_dir, drafters = os.path.join(tmp, "specar"), os.path.join(tmp, "specar_drafters")
    os.makedirs(specar_dir)
    bad = os.path.join(drafters, "hawk-no-format")
    os.makedirs(bad)
    with open(os.path.join(bad, "drafter.json"), "w") as f:
        json.dump({"kind": "hawk", "config": {}}, f)  # no "format": not listed, refused at queue time
    open(os.path.join(bad, "drafter.safetensors"), "wb").close()
    glm = None
    try:
        from support.tiny_glm_image import comfyui_folder
        # named as the released folder, so the GLM-Image example workflow finds it as is
        folder = comfyui_folder(specar_dir, GLM_IMAGE)
        broken = os.path.join(specar_dir, "GLM-Image-broken")
        shutil.copytree(folder, broken)
        for name in os.listdir(os.path.join(broken, "vision_language_encoder")):
            if name.endswith(".safetensors"):
                with open(os.path.join(broken, "vision_language_encoder", name), "wb") as f:
                    f.write(b"not a safetensors file")
        incomplete = os.path.join(specar_dir, "GLM-Image-incomplete")  # model_index.json and no AR weights
        os.makedirs(os.path.join(incomplete, "vision_language_encoder"))
        shutil.copy(os.path.join(folder, "model_index.json"), incomplete)
        glm = "built"
    except Exception as e:  # no GLM-Image in this transformers, for one
        glm = f"the tiny GLM-Image folder was not built: {type(e).__name__}: {e}"
    try:  # a tiny Emu3.5-Image folder (support/tiny_emu35.py) under the released name: test_comfyui_emu35.py
        from support.tiny_emu35 import build
        build(os.path.join(specar_dir, "Emu3.5-Image"))
    except Exception as e:  # that test skips naming the missing folder
        print(f"the tiny Emu3.5-Image folder was not built: {type(e).__name__}: {e}")
    with open(os.path.join(tmp, "extra_model_paths.yaml"), "w") as f:
        f.write(f"specar_test:\n  base_path: {tmp}\n  specar: specar\n  specar_drafters: specar_drafters\n")
    return glm


def _input_folder(tmp):
    """The server's --input-directory, holding REFERENCE (LoadImage's list): a 64x48 RGB PNG of a fixed pattern, a
    colour gradient with a bright diagonal stripe."""
    from PIL import Image
    folder = os.path.join(tmp, "input")
    os.makedirs(folder)
    w, h = 64, 48
    pixels = bytes(v for y in range(h) for x in range(w)
                   for v in (x * 4 % 256, y * 5 % 256, 255 if abs(x - y) < 4 else 40))
    Image.frombytes("RGB", (w, h), pixels).save(os.path.join(folder, REFERENCE))
    return folder


def _python_path() -> str:
    """The server's PYTHONPATH, as serve.sh's: the torchvision / torchaudio stand-ins, whose sitecustomize.py tells
    transformers that torchvision is absent (its PIL image processors then, as in a real install without it)."""
    return os.path.join(SHARED, "stubs")


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    where = comfyui_dir()
    assert where is not None, "set COMFYUI_DIR or COMFYUI_VERSION"  # test_comfyui_server.py skips without them
    python = os.path.join(where, ".venv", "bin", "python")
    assert os.path.isfile(os.path.join(where, "main.py")) and os.access(python, os.X_OK), \
        f"{where} is not a ComfyUI folder made by setup.sh (main.py and .venv/bin/python)"
    tmp = str(tmp_path_factory.mktemp("comfyui"))
    glm = _model_folders(tmp)
    inputs = _input_folder(tmp)
    port = int(os.environ.get("COMFYUI_PORT") or _free_port())
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1",  # the log is read while the server runs
           "PYTHONPATH": _python_path()}
    log_path = os.path.join(tmp, "server.log")
    started = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--disable-auto-launch",
             "--extra-model-paths-config", os.path.join(tmp, "extra_model_paths.yaml"),
             "--output-directory", os.path.join(tmp, "output"), "--temp-directory", os.path.join(tmp, "temp"),
             "--input-directory", inputs],
            cwd=where, stdout=log, stderr=subprocess.STDOUT, env=env)
    srv = Server(f"http://127.0.0.1:{port}", port, proc, log_path, tmp)
    srv.glm = glm
    try:
        while True:
            try:
                srv.object_info = srv.get("/object_info")
                break
            except OSError:
                assert proc.poll() is None, srv.log()[-4000:]
                assert time.time() - started < START_TIMEOUT, srv.log()[-4000:]
                time.sleep(1)
        srv.start_s = time.time() - started
        srv.diffusers = subprocess.run([python, "-c", "import diffusers; print(diffusers.__version__)"],
                                       capture_output=True, text=True).stdout.strip()
        srv.dynamic = "sjd_pac_window" not in srv.object_info.get("SpecARSampler", {}).get("input", {}).get(
            "required", {})
        yield srv
    finally:
        if srv.ws is not None:
            srv.ws.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.environ.get("COMFYUI_KEEP_LOG"):
            shutil.copy(log_path, os.environ["COMFYUI_KEEP_LOG"])
