"""gpu-check's runner: each stage in its own Python process with its own time budget, so that a failure (an
exception, a CUDA error or device-side assert that poisons the process's CUDA context, an out-of-memory, a
crash) or a stage that runs past its budget is recorded and the next stage still runs; what a stage saved
before it was cut is kept. Every stage records its peak device memory, what torch logged about graph breaks,
recompiles and CUDA graphs, and torch._dynamo's counters (`StageContext`)."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Optional

from .records import counters, counters_diff

BLOCKING_RERUN_MIN_S = 30  # a CUDA-error stage is rerun blocking only with at least this much total budget left
CUDA_ERROR_MARKERS = ("CUDA error", "device-side assert", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS",
                      "an illegal memory access")
# what torch logs that the report keeps (from its graph-break, recompile, CUDA-graph and perf-hint logs)
LOG_KEEP = 200
PROGRESS_S = 10.0  # seconds between the readings of a running stage's record (the report written so far)


class StageContext:
    """What a stage function sees: the options, its deadline, the records of the stages before it,
    its own result dict (saved to `path` as it goes) and its peak memory."""

    def __init__(self, name: str, options: dict, deadline: float, previous: dict, path: Optional[str] = None):
        self.name, self.options, self.deadline, self.previous, self.path = name, options, deadline, previous, path
        self.result: dict = {}
        self.peak_memory_bytes: Optional[int] = None
        self.log = LogCapture()
        self.status = "running"
        self.counters_start = counters()  # dynamo's counters are per process: the stage's own are the difference

    def time_left(self) -> float:
        return self.deadline - time.time()

    def track_memory(self) -> None:
        import torch
        if torch.device(self.options["device"]).type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.options["device"])
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, peak)

    def record(self) -> dict:
        return {"status": self.status, "result": self.result, "peak_memory_bytes": self.peak_memory_bytes,
                "peak_host_rss_bytes": _peak_rss(), "torch_log": self.log.summary(),
                "dynamo_counters": counters_diff(self.counters_start, counters())}

    def save(self) -> None:
        if self.path:  # atomic: a stage killed mid-write leaves the previous save
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.record(), f, default=json_default)
            os.replace(tmp, self.path)


def json_default(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    return repr(x)


def _peak_rss() -> Optional[int]:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    except (ImportError, OSError):
        return None


class LogCapture(logging.Handler):
    """Torch's messages about graph breaks, recompiles, CUDA graphs (skipped, re-recorded) and
    performance hints, switched on for the stage and kept (deduplicated, with counts)."""

    # cudagraph_static_inputs: which inputs CUDA graph trees take as static (by source name), so that a
    # re-record per step ("static input data pointer changed": the second H200 run) names its input
    ARTIFACTS = ("graph_breaks", "recompiles", "cudagraphs", "perf_hints", "cudagraph_static_inputs")

    # messages counted apart from the kept ones (never cut by LOG_KEEP): a stage reads them before and after
    # a generation (`count`), e.g. CUDA graph trees' re-recordings in a generation after the first
    COUNTED = ("Re-recording", "skipping cudagraphs")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: dict = {}
        self.loggers: list = []
        self.counts = dict.fromkeys(self.COUNTED, 0)

    def count(self, text: str) -> int:
        return self.counts.get(text, 0)

    def emit(self, record):
        try:
            text = record.getMessage().strip()
        except Exception:  # noqa: BLE001 -- a malformed record must not break the stage
            return
        for c in self.COUNTED:
            if c in text:
                self.counts[c] += 1
        key = f"{record.name}: {text[:600]}"
        if key in self.messages or len(self.messages) < LOG_KEEP:
            self.messages[key] = self.messages.get(key, 0) + 1

    def start(self) -> None:
        try:
            import torch._logging
            on = {}
            for a in self.ARTIFACTS:  # one at a time: a torch that lacks one artifact still logs the others
                try:
                    torch._logging.set_logs(**{**on, a: True})
                    on[a] = True
                except Exception as e:  # noqa: BLE001
                    self.messages[f"gpu-check: torch._logging.set_logs({a}=True) failed: {e}"[:300]] = 1
        except Exception as e:  # noqa: BLE001 -- capture what reaches the loggers anyway
            self.messages[f"gpu-check: torch._logging unavailable: {e}"[:300]] = 1
        names = ["torch"]
        try:
            from torch._logging._internal import log_registry
            names += list(log_registry.get_log_qnames())  # torch's own loggers do not propagate to "torch"
        except Exception:  # noqa: BLE001
            pass
        for n in dict.fromkeys(names):
            logging.getLogger(n).addHandler(self)
            self.loggers.append(n)

    def stop(self) -> None:
        for n in self.loggers:
            logging.getLogger(n).removeHandler(self)
        try:
            import torch._logging
            torch._logging.set_logs()  # back to torch's defaults
        except Exception:  # noqa: BLE001
            pass

    def summary(self) -> list:
        return [{"message": k, "count": v} for k, v in self.messages.items()]


def run_stage_here(ctx: StageContext) -> None:
    """Run one stage in this process, recording failure (with the traceback) instead of raising."""
    import torch

    from .stages import STAGES
    ctx.log.start()
    ctx.save()
    try:
        if torch.device(ctx.options["device"]).type == "cuda":  # also where a broken CUDA set-up shows first
            torch.cuda.reset_peak_memory_stats(ctx.options["device"])
        STAGES[ctx.name](ctx)
        ctx.status = "ok"
    except BaseException as e:  # noqa: BLE001 -- a stage's failure is data (KeyboardInterrupt too: recorded, then raised)
        if isinstance(e, StageTimeout):
            ctx.status = "timed out"
        else:
            ctx.status = "failed"
            ctx.result["error"] = _traceback_summary(e)
        if isinstance(e, KeyboardInterrupt):
            raise
    finally:
        try:
            ctx.track_memory()
        except Exception as e:  # noqa: BLE001 -- a poisoned CUDA context cannot report its memory
            ctx.result.setdefault("memory_error", f"{type(e).__name__}: {e}"[:300])
        ctx.log.stop()
        ctx.save()


def _traceback_summary(e: BaseException) -> dict:
    frames = traceback.extract_tb(e.__traceback__)
    msg = str(e).strip()
    return {"type": type(e).__name__, "message": msg[:2000],
            "cuda_error": any(m in msg for m in CUDA_ERROR_MARKERS) or "OutOfMemory" in type(e).__name__,
            "traceback": [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}: {(f.line or '').strip()[:160]}"
                          for f in frames[-12:]]}


class StageTimeout(BaseException):
    """A stage past its budget (--in-process): not an Exception, so a stage's per-item handlers let it through."""


def child_main() -> None:
    """A stage process: `python -c 'from specar.tooling.gpu_check.runner import child_main; child_main()' SPEC`."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    ctx = StageContext(spec["stage"], spec["options"], spec["deadline"], spec["previous"], spec["result_path"])
    run_stage_here(ctx)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the record is saved: no interpreter shutdown (compile worker pools, CUDA teardown) to hang on


def _package_path() -> Optional[str]:
    """The folder to put on the stage process's PYTHONPATH so that it imports this same `specar`: the
    one holding this package when the package's folder is named `specar` (a link, a ComfyUI custom
    node folder); None for an installed package, which the stage process imports as this one did."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.dirname(root) if os.path.basename(root) == __name__.split(".")[0] else None


def _tail(path: str, chars: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def _read_record(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"status": "running", "result": {}}


def run_stage_process(name: str, options: dict, budget: float, previous: dict, workdir: str,
                      extra_env: Optional[dict] = None, progress=None) -> dict:
    """One stage in its own process, killed (with its process group: compile workers too) after
    `budget` seconds; what it saved before is kept. `progress(record)`: every PROGRESS_S seconds while it
    runs, with what it has saved so far."""
    tag = name + ("_blocking" if extra_env else "")
    result_path = os.path.join(workdir, f"{tag}.json")
    spec_path = os.path.join(workdir, f"{tag}.spec.json")
    with open(spec_path, "w") as f:
        json.dump({"stage": name, "options": options, "deadline": time.time() + budget, "previous": previous,
                   "result_path": result_path}, f, default=json_default)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_path(), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_USE_CUDA_DSA", "1")  # device-side assertions, where this torch was built with them
    env.update(extra_env or {})
    out_path, err_path = os.path.join(workdir, f"{tag}.stdout"), os.path.join(workdir, f"{tag}.stderr")
    code = f"from {__name__} import child_main; child_main()"
    t0 = time.time()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, spec_path], stdout=out, stderr=err, env=env,
                                start_new_session=True)
        timed_out, rc = False, None
        while rc is None:
            left = t0 + budget - time.time()
            try:
                rc = proc.wait(timeout=max(0.0, min(PROGRESS_S, left)))
            except subprocess.TimeoutExpired:
                if left > PROGRESS_S:
                    if progress:
                        progress(dict(_read_record(result_path), seconds=round(time.time() - t0, 1)))
                    continue
                timed_out = True
                try:  # the stage process and what it started (compile workers): the process group made above,
                    os.killpg(proc.pid, signal.SIGKILL)  # its leader not yet reaped, so the group is still ours
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                rc = proc.wait()
    record = _read_record(result_path)
    if timed_out and record.get("status") in ("ok", "failed"):
        record["note"] = "the stage had finished and saved its record; its process was killed while exiting"
    elif timed_out:
        record["status"] = "timed out"
    elif record.get("status") not in ("ok", "failed", "timed out"):
        record["status"] = "failed"  # died without saying why: a crash, an abort, the OOM killer
        record.setdefault("result", {})["error"] = {
            "type": "process exit", "message": f"the stage process exited with code {rc} before finishing",
            "cuda_error": any(m in _tail(err_path) for m in CUDA_ERROR_MARKERS), "traceback": []}
    record["exit_code"] = rc
    record["seconds"] = round(time.time() - t0, 1)
    record["stderr_tail"] = _tail(err_path, 3000)
    return record


def run_stage_inline(name: str, options: dict, budget: float, previous: dict) -> dict:
    """One stage in this process (--in-process): budget by SIGALRM (main thread, Unix)."""
    ctx = StageContext(name, options, time.time() + budget, previous)
    t0 = time.time()

    def alarm(signum, frame):
        raise StageTimeout(f"stage {name} ran past its {budget:.0f} s budget")

    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, budget)
    try:
        run_stage_here(ctx)
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    record = ctx.record()
    record["seconds"] = round(time.time() - t0, 1)
    return record


def had_cuda_error(record: dict) -> bool:
    """A stage that failed with a CUDA error, or recorded one for an item it then went past."""
    err = (record.get("result") or {}).get("error") or {}
    if record.get("status") == "failed" and err.get("cuda_error"):
        return True
    text = json.dumps(record.get("result") or {}, default=json_default)
    return any(m in text for m in CUDA_ERROR_MARKERS)


def run_check(options: dict, in_process: bool = False, log=None, command: str = "python -m specar.tooling gpu-check",
              on_update=None) -> dict:
    """Every selected stage, in order, within the total budget; then, with what is left of it, each
    stage that met a CUDA error once more with blocking launches (CUDA reports a kernel's error at a
    later call: the rerun's traceback names the kernel). The report as a dict; `on_update(report)` with
    the report so far after each stage and while a stage process runs (what a killed command leaves)."""
    t_start = time.time()
    deadline = t_start + options["total_budget"]
    stages = {}
    say = log or (lambda s: None)

    def report() -> dict:
        meta = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "wall_s": round(time.time() - t_start, 1), "in_process": in_process,
                **{k: options[k] for k in ("dry_run", "device", "compile", "total_budget", "budgets", "samples")}}
        return {"meta": meta, "plan": options.get("plan"), "stages": dict(stages)}

    def running(name: str, budget: float):
        def progress(rec: dict) -> None:
            stages[name] = dict(rec, budget_s=round(budget, 1))
            on_update(report())
        return progress if on_update else None

    with tempfile.TemporaryDirectory(prefix="specar-gpu-check-") as workdir:
        for name in options["stages"]:
            left = deadline - time.time()
            if left < 5:
                stages[name] = {"status": "skipped", "reason": "total budget spent", "budget_s": 0}
                continue
            budget = min(options["budgets"][name], left)
            say(f"gpu-check: stage {name} (budget {budget:.0f} s)")
            if in_process:
                rec = run_stage_inline(name, options, budget, dict(stages))
            else:
                rec = run_stage_process(name, options, budget, dict(stages), workdir, progress=running(name, budget))
            rec["budget_s"] = round(budget, 1)
            stages[name] = rec
            say(f"gpu-check: stage {name}: {rec['status']} in {rec.get('seconds', 0):.1f} s")
            if on_update:
                on_update(report())
        for name, rec in list(stages.items()):
            left = deadline - time.time()
            if in_process or not had_cuda_error(rec) or left < BLOCKING_RERUN_MIN_S:
                continue
            budget = min(options["budgets"][name], left)
            say(f"gpu-check: stage {name} again with CUDA_LAUNCH_BLOCKING=1 (budget {budget:.0f} s)")
            previous = {n: r for n, r in stages.items() if n != name}
            rec["blocking_rerun"] = run_stage_process(name, options, budget, previous, workdir,
                                                      {"CUDA_LAUNCH_BLOCKING": "1"})
            if on_update:
                on_update(report())
    return report()


__all__ = ["StageContext", "child_main", "had_cuda_error", "json_default", "run_check", "run_stage_inline",
           "run_stage_process"]
