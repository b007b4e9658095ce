"""`python -m specar gpu-check`: the CUDA path exercised in one command, each stage isolated.

Stages (cli/gpu_stages.py), each in its own Python process with its own time budget, so that a
failure (an exception, a CUDA error or device-side assert that poisons the process's CUDA context,
an out-of-memory, a crash) or a stage that runs past its budget is recorded and the next stage
still runs:
  environment  torch / CUDA / driver versions, the device, bf16, SDPA kernels, a compile smoke test,
               measured copy bandwidth and bf16 matrix-product rate
  exactness    chi-square vs exact enumeration for ar / scd / sjd_pac / hawk / adt_tree on tiny
               models on the device (a correct sampler fails the stage with probability < 1e-4),
               and a planted bug the same test must catch
  backends     every backend eager vs compiled (the model's compiled step: CUDA graphs, mode
               reduce-overhead) on the demo model: latency, forwards, compression, compile time,
               graph breaks, recompiles, dynamo's counters, tokens equal to eager's
  forward_7b   forward latency of a random-weight Lumina-mGPT-7B-shape model in bf16 for 1..65
               tokens x 2 CFG rows over a full static KV cache, eager and compiled, and the roofline
               projection (cli/roofline.py) re-fitted to them
Every stage records its peak device memory (torch.cuda.max_memory_allocated, reset per stage),
what torch logged about graph breaks, recompiles and CUDA graphs, and torch._dynamo's counters.
A stage that met a CUDA error is run once more with CUDA_LAUNCH_BLOCKING=1 after the other stages
(with what is left of the total budget), so that its traceback names the kernel that failed.

Writes gpu_check.json and gpu_check.md to --out. `--dry-run` runs the same stages on the CPU at
tiny shapes (a tiny Llama in place of the 7B shape, few samples, compiled AR only).
"""
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

from .args import non_negative_int, positive_int

# the repository root (= the package folder): docs/ lies beside the code
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BENCH_JSON = os.path.join(REPO_ROOT, "docs", "figures", "bench_defaults_1125.json")
STAGE_NAMES = ["environment", "exactness", "backends", "forward_7b"]
# seconds per stage on CUDA (sum 520: the whole check ends within 9 minutes with process starts)
CUDA_BUDGETS = {"environment": 30, "exactness": 30, "backends": 290, "forward_7b": 170}
CUDA_TOTAL = 520
# on the CPU (--dry-run): generous, a loaded shared machine must not cut a tiny stage
DRY_BUDGETS = {"environment": 120, "exactness": 240, "backends": 400, "forward_7b": 300}
DRY_TOTAL = 1200
BLOCKING_RERUN_MIN_S = 30  # a CUDA-error stage is rerun blocking only with at least this much total budget left
CUDA_ERROR_MARKERS = ("CUDA error", "device-side assert", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS",
                      "an illegal memory access")
# what torch logs that the report keeps (from its graph-break, recompile, CUDA-graph and perf-hint logs)
LOG_KEEP = 200


def add_arguments(ap) -> None:
    ap.add_argument("--out", default="output/gpu-check", help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: the same stages on the CPU at tiny shapes (checks the command itself)")
    ap.add_argument("--device", default=None, help="cuda, cuda:N (default: cuda; --dry-run: cpu)")
    ap.add_argument("--stages", nargs="+", choices=STAGE_NAMES, default=STAGE_NAMES, help="stages to run, in order")
    ap.add_argument("--no-compile", action="store_true", help="skip every torch.compile (eager only)")
    ap.add_argument("--budget", type=float, default=None,
                    help=f"total seconds (default {CUDA_TOTAL} on CUDA, {DRY_TOTAL} with --dry-run)")
    ap.add_argument("--stage-budget", action="append", default=[], metavar="STAGE=SECONDS",
                    help="one stage's time budget (repeatable), e.g. backends=400")
    ap.add_argument("--samples", type=positive_int, default=None,
                    help="images per chi-square case (default 16000 on CUDA, as the CPU suite; 1500 with --dry-run)")
    ap.add_argument("--backends", nargs="+", default=None, metavar="BACKEND",
                    help="the backends stage's backends, in order (default: all; compiled runs in this order too)")
    ap.add_argument("--compiled-tokens-7b", nargs="+", type=positive_int, default=None, metavar="T",
                    help="the forward_7b stage's compiled token counts, in order (default: 1 33 65 17 9 2 49 5)")
    ap.add_argument("--seed", type=non_negative_int, default=0, help="seed of the backends stage's generations")
    ap.add_argument("--bench-json", default=DEFAULT_BENCH_JSON,
                    help="the `bench --json` file whose step compressions the refitted projection uses")
    ap.add_argument("--in-process", action="store_true",
                    help="run the stages in this process (no crash isolation; time budgets by SIGALRM): for tests "
                         "and debugging")


def parse_budgets(items) -> dict:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or name not in STAGE_NAMES:
            raise ValueError(f"--stage-budget must be STAGE=SECONDS with STAGE one of {', '.join(STAGE_NAMES)}, "
                             f"got {item!r}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--stage-budget {item!r}: SECONDS must be a number") from None
        if out[name] <= 0:
            raise ValueError(f"--stage-budget {item!r}: SECONDS must be > 0")
    return out


def options_from_args(args) -> dict:
    """The run's options as plain data (what each stage process receives)."""
    import torch
    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU is available here; run with --dry-run to check the "
                         f"command on the CPU")
    if dev.type != "cuda" and not dry:
        raise ValueError(f"--device {device}: gpu-check measures a CUDA device; use --dry-run for the CPU")
    budgets = dict(DRY_BUDGETS if dry else CUDA_BUDGETS)
    budgets.update(parse_budgets(args.stage_budget))
    total = args.budget if args.budget is not None else (DRY_TOTAL if dry else CUDA_TOTAL)
    if total <= 0:
        raise ValueError(f"--budget must be > 0 seconds, got {total}")
    from .gpu_stages import BACKEND_ORDER, COMPILED_TOKENS_7B
    if args.backends:
        from ..samplers.backends import SCHEMAS
        unknown = [b for b in args.backends if b not in SCHEMAS]
        if unknown:
            raise ValueError(f"--backends: unknown backend(s) {unknown}; allowed: {sorted(SCHEMAS)}")
    return {
        "dry_run": dry, "device": device, "stages": list(args.stages), "compile": not args.no_compile,
        "budgets": budgets, "total_budget": total, "seed": args.seed, "bench_json": args.bench_json,
        "samples": args.samples or (1500 if dry else 16000),
        "dtype": "float32" if dev.type == "cpu" else "bfloat16",  # the backends stage's model (CUDA: the product's bf16)
        "dtype_7b": "bfloat16",  # the 7B shape: bf16 on the CPU too, so that the dry run goes through the bf16 path
        # dry run: compile only where quick (AR's one shape, one 7B-shape token count)
        "backends": args.backends,
        "compile_backends": ["ar"] if dry else list(args.backends or BACKEND_ORDER),
        "tokens_7b": [1, 2, 3, 5, 9, 17, 33] if dry else list(range(1, 66)),
        "compiled_tokens_7b": args.compiled_tokens_7b or ([1] if dry else list(COMPILED_TOKENS_7B)),
        "repeats_7b": 3 if dry else 10,
    }


# ---------------------------------------------------------------------------------------------
# inside a stage


class StageContext:
    """What a stage function sees: the options, its deadline, the records of the stages before it,
    its own result dict (saved to `path` as it goes) and its peak memory."""

    def __init__(self, name: str, options: dict, deadline: float, previous: dict, path: Optional[str] = None):
        self.name, self.options, self.deadline, self.previous, self.path = name, options, deadline, previous, path
        self.result: dict = {}
        self.peak_memory_bytes: Optional[int] = None
        self.log = LogCapture()
        self.status = "running"
        self.counters_start = _counters()  # dynamo's counters are per process: the stage's own are the difference

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
                "dynamo_counters": counters_diff(self.counters_start, _counters())}

    def save(self) -> None:
        if self.path:  # atomic: a stage killed mid-write leaves the previous save
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.record(), f, default=_json_default)
            os.replace(tmp, self.path)


def _json_default(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    return repr(x)


def _peak_rss() -> Optional[int]:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    except (ImportError, OSError):
        return None


def _counters() -> dict:
    from .gpu_stages import _counters as counters
    return counters()


def counters_diff(before: dict, after: dict) -> dict:
    from .gpu_stages import counters_diff as diff
    return diff(before, after)


class LogCapture(logging.Handler):
    """Torch's messages about graph breaks, recompiles, CUDA graphs (skipped, re-recorded) and
    performance hints, switched on for the stage and kept (deduplicated, with counts)."""

    # cudagraph_static_inputs: which inputs CUDA graph trees take as static (by source name), so that a
    # re-record per step ("static input data pointer changed": the second H200 run) names its input
    ARTIFACTS = ("graph_breaks", "recompiles", "cudagraphs", "perf_hints", "cudagraph_static_inputs")

    # messages counted apart from the kept ones (never cut by LOG_KEEP): a stage reads them before and after
    # a generation (`count`), e.g. CUDA graph trees' re-recordings in a generation after the first
    COUNTED = ("Re-recording",)

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

    from .gpu_stages import STAGES
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
    """A stage process: `python -c 'from specar.cli.gpu_check import child_main; child_main()' SPEC`."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    ctx = StageContext(spec["stage"], spec["options"], spec["deadline"], spec["previous"], spec["result_path"])
    run_stage_here(ctx)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the record is saved: no interpreter shutdown (compile worker pools, CUDA teardown) to hang on


# ---------------------------------------------------------------------------------------------
# the runner


def _package_path() -> Optional[str]:
    """The folder to put on the stage process's PYTHONPATH so that it imports this same `specar`: the
    one holding this package when the package's folder is named `specar` (a link, a ComfyUI custom
    node folder); None for an installed package, which the stage process imports as this one did."""
    return os.path.dirname(REPO_ROOT) if os.path.basename(REPO_ROOT) == "specar" else None


def _tail(path: str, chars: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def run_stage_process(name: str, options: dict, budget: float, previous: dict, workdir: str,
                      extra_env: Optional[dict] = None) -> dict:
    """One stage in its own process, killed (with its process group: compile workers too) after
    `budget` seconds; what it saved before is kept."""
    tag = name + ("_blocking" if extra_env else "")
    result_path = os.path.join(workdir, f"{tag}.json")
    spec_path = os.path.join(workdir, f"{tag}.spec.json")
    with open(spec_path, "w") as f:
        json.dump({"stage": name, "options": options, "deadline": time.time() + budget, "previous": previous,
                   "result_path": result_path}, f, default=_json_default)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_path(), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCH_USE_CUDA_DSA", "1")  # device-side assertions, where this torch was built with them
    env.update(extra_env or {})
    out_path, err_path = os.path.join(workdir, f"{tag}.stdout"), os.path.join(workdir, f"{tag}.stderr")
    code = "from specar.cli.gpu_check import child_main; child_main()"
    t0 = time.time()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, spec_path], stdout=out, stderr=err, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=budget)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            try:  # the stage process and what it started (compile workers): the process group made above,
                os.killpg(proc.pid, signal.SIGKILL)  # its leader not yet reaped, so the group is still ours
            except (ProcessLookupError, PermissionError):
                proc.kill()
            rc = proc.wait()
    try:
        with open(result_path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {"status": "running", "result": {}}
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
    text = json.dumps(record.get("result") or {}, default=_json_default)
    return any(m in text for m in CUDA_ERROR_MARKERS)


def run_check(options: dict, in_process: bool = False, log=None, command: str = "") -> dict:
    """Every selected stage, in order, within the total budget; then, with what is left of it, each
    stage that met a CUDA error once more with blocking launches (CUDA reports a kernel's error at a
    later call: the rerun's traceback names the kernel). The report as a dict."""
    t_start = time.time()
    deadline = t_start + options["total_budget"]
    stages = {}
    say = log or (lambda s: None)
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
                rec = run_stage_process(name, options, budget, dict(stages), workdir)
            rec["budget_s"] = round(budget, 1)
            stages[name] = rec
            say(f"gpu-check: stage {name}: {rec['status']} in {rec.get('seconds', 0):.1f} s")
        for name, rec in list(stages.items()):
            left = deadline - time.time()
            if in_process or not had_cuda_error(rec) or left < BLOCKING_RERUN_MIN_S:
                continue
            say(f"gpu-check: stage {name} again with CUDA_LAUNCH_BLOCKING=1 (budget {min(options['budgets'][name], left):.0f} s)")
            previous = {n: r for n, r in stages.items() if n != name}
            rec["blocking_rerun"] = run_stage_process(name, options, min(options["budgets"][name], left), previous,
                                                      workdir, {"CUDA_LAUNCH_BLOCKING": "1"})
    return {"meta": {"command": command or "python -m specar gpu-check",
                     "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "wall_s": round(time.time() - t_start, 1),
                     "in_process": in_process, **{k: options[k] for k in ("dry_run", "device", "compile",
                                                                          "total_budget", "budgets", "samples")}},
            "stages": stages}


# ---------------------------------------------------------------------------------------------
# the markdown report


def _fmt(x, spec=".3g", none="-"):
    if x is None:
        return none
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return format(x, spec)
    return str(x)


def _mib(x):
    return "-" if x is None else f"{x / 2**20:,.0f} MiB"


def markdown(report: dict) -> str:
    m, st = report["meta"], report["stages"]
    env = st.get("environment", {}).get("result", {})
    head = "GPU check" + (" (DRY RUN on the CPU: tiny shapes, no GPU figure)" if m["dry_run"] else "")
    lines = [f"# {head}", "", f"`{m['command']}`, {m['date']}, {m['wall_s']} s, device {m['device']}"
             f" ({env.get('device_name', '?')}), torch {env.get('torch', '?')}", "",
             "| stage | status | seconds | budget s | peak device memory | peak host RSS | error |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    rows = [(name, rec) for name, rec in st.items()]
    rows += [(f"{name} (rerun, CUDA_LAUNCH_BLOCKING=1)", rec["blocking_rerun"]) for name, rec in st.items()
             if rec.get("blocking_rerun")]
    for name, rec in rows:
        err = rec.get("result", {}).get("error") or {}
        err_text = f"{err.get('type', '')}: {err.get('message', '')}".strip(": ").splitlines()[0][:120] if err else ""
        if rec.get("reason"):
            err_text = rec["reason"]
        lines.append(f"| {name} | {rec['status']} | {_fmt(rec.get('seconds'))} | {_fmt(rec.get('budget_s'))} | "
                     f"{_mib(rec.get('peak_memory_bytes'))} | {_mib(rec.get('peak_host_rss_bytes'))} | "
                     f"{err_text.replace('|', '/')} |")
    for name, fn in (("environment", _md_environment), ("exactness", _md_exactness), ("backends", _md_backends),
                     ("forward_7b", _md_forward)):
        if name in st and st[name].get("result"):
            try:
                lines += [""] + fn(st[name]["result"])
            except Exception as e:  # noqa: BLE001 -- a partial record must not lose the report
                lines += ["", f"({name}: table not written: {type(e).__name__}: {e})"]
    failed = [(n, rec["result"]["error"]) for n, rec in rows if (rec.get("result") or {}).get("error")]
    if failed:
        lines += ["", "## Errors (the last frames of each traceback)", ""]
        for n, err in failed:
            lines += [f"{n}: {err.get('type')}: {str(err.get('message', '')).strip()[:600]}", "```"]
            lines += err.get("traceback") or ["(no traceback: the process ended without one)"]
            lines += ["```", ""]
    logs = [(n, x) for n, rec in st.items() for x in rec.get("torch_log", [])]
    if logs:
        lines += ["", "## What torch logged (graph breaks, recompiles, CUDA graphs, perf hints)", ""]
        lines += [f"- {n}: {x['message'].splitlines()[0][:200]} (x{x['count']})" for n, x in logs[:60]]
    return "\n".join(lines) + "\n"


def _md_environment(r: dict) -> list:
    keys = ["python", "torch", "torch_cuda", "cudnn", "cuda_driver_api", "nvidia_smi", "transformers", "triton", "device_name",
            "capability", "memory_bytes", "multiprocessors", "bf16_supported", "dynamo_supported", "compile_config"]
    lines = ["## Environment", "", "| item | value |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(r[k])} |" for k in keys if k in r]
    smoke = r.get("compile_smoke", {})
    lines.append(f"| compile smoke test | {_fmt(smoke.get('ok'))} {smoke.get('error', '')}"
                 f"{' ' + str(smoke.get('seconds')) + ' s' if 'seconds' in smoke else ''} |")
    for variant, v in (r.get("cudagraph_probe") or {}).items():
        text = v.get("error") or (f"CUDA graphs skipped {v['cudagraph_skips']} time(s), results equal to eager: "
                                  f"{_fmt(v['results_equal_eager'])}, {v['seconds']} s")
        lines.append(f"| cache-writing step, reduce-overhead, {variant} | {text.replace('|', '/')} |")
    pk = r.get("peaks", {})
    if pk:
        lines.append(f"| measured copy bandwidth | {pk['copy_bytes_per_s'] / 1e9:,.0f} GB/s (read + write) |")
        lines.append(f"| measured {pk['matmul_dtype']} matrix product | {pk['matmul_flops_per_s'] / 1e12:,.3g} TFLOP/s "
                     f"({pk['matmul_size']}^3) |")
    for k, v in (r.get("sdpa") or {}).items():
        lines.append(f"| SDPA {k} | {json.dumps(v)[:200].replace('|', '/')} |")
    return lines


def _md_exactness(r: dict) -> list:
    lines = [f"## Exactness on {r.get('device')} ({r.get('samples')} images per case, fails at p < "
             f"{r.get('p_fail')})", "", "| backend | params | model | setting | p-value | TV | compression | passed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in r.get("cases", []):
        if "skipped" in c or "error" in c:
            lines.append(f"| {c['backend']} | | | | {c.get('skipped') or c.get('error')} | | | {_fmt(c.get('passed'))} |")
            continue
        lines.append(f"| {c['backend']} | {json.dumps(c['params'])} | {c['model']} | {c['setting']} | "
                     f"{c['p_value']:.3g} | {c['total_variation']:.4f} | {c['step_compression']:.2f} | "
                     f"{_fmt(c['passed'])} |")
    pl = r.get("planted_wrong_residual")
    if pl:
        lines += ["", f"Planted bug (wrong residual, sjd): p = {_fmt(pl.get('p_value'))}, caught: "
                      f"{_fmt(pl.get('caught'))} {pl.get('error', '')}"]
    lines.append(f"All passed: {_fmt(r.get('all_passed'))}")
    return lines


def _md_backends(r: dict) -> list:
    lines = [f"## Backends on {r.get('model')} ({r.get('dtype')}, {r.get('device')}, one run each)", "",
             "| backend | eager s | eager x AR | forwards | compression | compiled s | compiled x AR | x eager | "
             "compile s | graphs | recompiles | breaks | cudagraph skips | re-recordings, 2nd generation | "
             "buffers rehomed, 2nd generation | tokens = eager |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for b, row in r.get("rows", {}).items():
        e, c = row.get("eager", {}), row.get("compiled", {})
        if c.get("error") or c.get("skipped"):
            c_cells = [c.get("error") or c.get("skipped")] + [""] * 10
        elif c:
            same = c.get("tokens_equal_eager")
            same_text = ("not compared (timing-dependent)" if not c.get("tokens_compared", True) else
                         _fmt(same) + ("" if same or same is None else
                                       f" ({c.get('tokens_differing')} differ, the first at token "
                                       f"{c.get('first_difference_at')})"))
            skips = c.get("counters", {}).get("inductor", {}).get("cudagraph_skips", 0)
            c_cells = [_fmt(c.get("latency_s")), _fmt(c.get("speedup_vs_ar"), ".2f"), _fmt(c.get("speedup_vs_eager"), ".2f"),
                       _fmt(c.get("compile_s")), _fmt(c.get("compiles")), _fmt(c.get("recompiles")),
                       _fmt(c.get("graph_breaks")), _fmt(skips), _fmt(c.get("rerecords_replay")),
                       _fmt(c.get("buffers_rehomed")),
                       same_text + (f"; EAGER FALLBACK: {c['eager_fallback']}" if c.get("eager_fallback") else "")]
        else:
            c_cells = ["not compiled"] + [""] * 10
        e_cells = ([e.get("error") or e.get("skipped"), "", "", ""] if (e.get("error") or e.get("skipped")) else
                   [_fmt(e.get("latency_s")), _fmt(e.get("speedup_vs_ar"), ".2f"), _fmt(e.get("forwards")),
                    _fmt(e.get("step_compression"), ".2f")])
        lines.append("| " + " | ".join([b] + [str(x).replace("|", "/") for x in e_cells + c_cells]) + " |")
    return lines


def _undetermined(fit: dict, name: str) -> str:
    return "" if fit.get(f"{name}_identified", True) else " (not determined by the fit: the assumed value kept)"


def _md_forward(r: dict) -> list:
    shape = r.get("shape", {})
    lines = [f"## Forward latency: {shape.get('name')} (hidden {shape.get('hidden_size')}, {shape.get('num_layers')} "
             f"layers, vocabulary {shape.get('vocab_size')}), {r.get('dtype')}, 2 CFG rows, KV slots "
             f"{r.get('kv_slots')}, {r.get('repeats')} timed forwards each", ""]
    fit = r.get("roofline_refit", {})
    rows = {f["tokens"]: f for f in fit.get("forwards", [])}
    tokens = sorted({int(t) for t in list(r.get("eager", {})) + list(r.get("compiled", {})) if t.isdigit()})
    lines += ["| tokens | eager ms | compiled ms | compile s | roofline ms (refit) | eager model ms (refit) |",
              "| --- | --- | --- | --- | --- | --- |"]
    for T in tokens:
        e, c, f = r.get("eager", {}).get(str(T), {}), r.get("compiled", {}).get(str(T), {}), rows.get(T, {})
        cell = lambda d: _fmt(d.get("forward_ms"), ".2f") if "forward_ms" in d else (d.get("error") or d.get("skipped") or "-")  # noqa: E731
        lines.append(f"| {T} | {cell(e)} | {cell(c)} | {_fmt(c.get('first_call_s'), '.1f')} | "
                     f"{_fmt(f.get('roofline_ms'), '.2f')} | {_fmt(f.get('eager_model_ms'), '.2f')} |")
    for mode in ("eager", "compiled"):
        if r.get(mode, {}).get("error"):
            lines.append(f"\n{mode}: {r[mode]['error']}")
    if fit.get("error"):
        return lines + ["", f"Roofline refit: {fit['error']}"]
    if not fit:
        return lines
    cf, ef = fit.get("compiled_fit", {}), fit.get("eager_fit", {})
    lines += ["", f"Roofline refit (cli/roofline.py's model) on {fit['card']} ({fit['card_source']}: "
                  f"{fit['bandwidth'] / 1e9:,.0f} GB/s, {fit['bf16_flops'] / 1e12:,.3g} TFLOP/s): efficiencies "
                  f"bandwidth {cf.get('bandwidth_eff')}{_undetermined(cf, 'bandwidth_eff')}, "
                  f"FLOPs {cf.get('flops_eff')}{_undetermined(cf, 'flops_eff')} "
                  f"({cf.get('note') or 'fitted on the compiled forwards, largest error ' + format(cf.get('max_abs_rel_error', 0), '.1%')}"
                  f"{', AT THE GRID EDGE' if cf.get('grid_edge') else ''}); launch cost "
                  f"{_fmt(ef.get('launch_s', 0) * 1e6, '.2f')} us per launch ({ef.get('launch_count_source', '-')}, "
                  f"{_fmt(ef.get('launches_per_forward_t1'), '.0f')} launches at 1 token; largest error "
                  f"{_fmt(ef.get('max_abs_rel_error'), '.1%')})"]
    proj = fit.get("projection", {})
    if proj.get("error"):
        return lines + ["", proj["error"]]
    if proj:
        names = proj["variants"]
        dry = "DRY RUN, CPU timings: meaningless as GPU figures. " if fit.get("dry_run") else ""
        lines += ["", f"{dry}PROJECTION (not a measurement) of Lumina-mGPT 7B 768x768 on {fit['card']} from the step "
                      f"compressions of {proj['bench_json']}: the paper-fitted constants (launch "
                      f"{proj['paper_launch_s'] * 1e6:.1f} us), and the constants re-fitted here", "",
                  "| backend | compr. | T/fwd | forwards | " + " | ".join(f"{n} s | {n} x AR" for n in names) + " |",
                  "| --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in names) + " |"]
        for t in proj["rows"]:
            if "error" in t:
                lines.append(f"| {t['label']} | {t['error']} |")
                continue
            cells = " | ".join(f"{t[n]['seconds']:.2f} | {_fmt(t[n].get('speedup_vs_ar'), '.2f')}" for n in names)
            lines.append(f"| {t['label']} | {_fmt(t['step_compression_total'], '.2f')} | "
                         f"{t['tokens_per_forward']:.1f} | {t['forwards']:.0f} | {cells} |")
    return lines


# ---------------------------------------------------------------------------------------------


def run(args):
    options = options_from_args(args)
    os.makedirs(args.out, exist_ok=True)
    argv = sys.argv[sys.argv.index("gpu-check") + 1:] if "gpu-check" in sys.argv else []
    report = run_check(options, in_process=args.in_process, log=lambda s: print(s, file=sys.stderr, flush=True),
                       command=" ".join(["python -m specar gpu-check", *argv]))
    json_path, md_path = os.path.join(args.out, "gpu_check.json"), os.path.join(args.out, "gpu_check.md")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1, default=_json_default)
    text = markdown(report)
    with open(md_path, "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return report


def main(argv=None):
    from .args import parse_command
    return run(parse_command("gpu-check", __doc__, add_arguments, argv))


__all__ = ["STAGE_NAMES", "child_main", "markdown", "options_from_args", "run", "run_check"]
