"""`python -m specar.tooling gpu-check`: its dry run end to end on the CPU
(the report's structure), stage isolation (a failing stage is recorded and the next one runs; a stage past its
budget is cut, keeping what it measured), the plan (every registered backend, predictions from committed
reports), the compiled path of one tiny case, and the roofline refit recovering known constants.

No GPU here: these tests check the command itself; its CUDA figures come from a GPU (docs/BENCHMARKS.md)."""
import dataclasses
import json
import subprocess
import sys

import pytest

from specar import tooling
from specar.model_loaders import capture as capture_mod
from specar.samplers import backends as registry
from specar.samplers.backends import SCHEMAS
from specar.tooling import gpu_check
from specar.tooling import roofline as rl
from specar.tooling.gpu_check import exactness, plan, refit, report, runner, stages
from specar.tooling.shapes import SHAPES


def options(*argv, dry=True, reports=None):
    return gpu_check.options_from_argv([*(["--dry-run"] if dry else []), *argv], reports)


def cli(tmp_path, *argv, timeout=240):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "specar.tooling", "gpu-check", "--dry-run", "--out", str(out), *argv],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "gpu_check.json") as f:
        report = json.load(f)
    return report, (out / "gpu_check.md").read_text()


@pytest.mark.long  # every stage of the maintainers' GPU check on the CPU (a minute); make test runs the stages apart
def test_dry_run_end_to_end_writes_the_json_and_the_markdown(tmp_path):
    report, md = cli(tmp_path, "--no-compile", "--samples", "300", "--image-families", "lumina-mgpt-2-7b")
    st = report["stages"]
    assert list(st) == gpu_check.STAGE_NAMES
    for name, rec in st.items():
        assert rec["status"] == "ok", (name, rec.get("result", {}).get("error"), rec.get("stderr_tail"))
        assert rec["seconds"] > 0 and rec["budget_s"] > 0 and rec["exit_code"] == 0
        assert isinstance(rec["torch_log"], list) and isinstance(rec["dynamo_counters"], dict)
        assert rec["peak_memory_bytes"] is None and rec["peak_host_rss_bytes"] > 0  # CPU: no device memory
    assert report["meta"]["dry_run"] and report["meta"]["device"] == "cpu" and not report["meta"]["compile"]
    env = st["environment"]["result"]
    assert env["torch"] and env["peaks"]["copy_bytes_per_s"] > 0 and "MATH" in env["sdpa"]
    ex = st["exactness"]["result"]
    cases = exactness.exactness_cases()
    assert [c["backend"] for c in ex["cases"]] == [c[0] for c in cases]
    assert {c["backend"] for c in ex["cases"]} == {m.name for m in SCHEMAS.values() if m.lossless}
    # each backend's own rejection sampling (what the planted residual bug breaks), but for the agreement mode's case
    assert [c["params"]["reproducible"] for c in ex["cases"]] == [p.get("reproducible", False) for _, p, _, _ in cases]
    assert sum(c["params"]["reproducible"] for c in ex["cases"]) == 1
    for c in ex["cases"]:
        assert 0 <= c["p_value"] <= 1 and c["samples"] == 300 and c["passed"] == (c["p_value"] > ex["p_fail"])
    # the stage's false-failure bound (a union bound over its cases)
    assert len(ex["cases"]) * ex["p_fail"] == pytest.approx(exactness.STAGE_P_FAIL) and exactness.STAGE_P_FAIL <= 1e-4
    assert "p_value" in ex["planted_wrong_residual"]
    rows = st["backends"]["result"]["rows"]
    assert list(rows) == report["plan"]["backend_order"] and set(rows) == set(SCHEMAS)
    base = rows[plan.RATIO_BASE]["eager"]["latency_s"]
    for b, row in rows.items():
        assert row["eager"]["latency_s"] > 0 and row["eager"]["forwards"] >= 1, b
        assert row["eager"]["speedup_vs_ar"] == base / row["eager"]["latency_s"]
        assert "compiled" not in row  # --no-compile
    fw = st["forward_7b"]["result"]
    timed = {int(T) for T, v in fw["eager"].items() if "forward_ms" in v}
    assert timed == {1, 2, 3, 5, 9, 17, 33} and fw["kv_slots"] > 33 and fw["dtype"] == "bfloat16"
    fit = fw["roofline_refit"]
    assert fit["eager_fit"]["launch_s"] is not None and fit["card_source"] == "measured"
    proj = fit["projection"]
    assert proj["kind"] == "projection" and proj["variants"] == ["paper_fit", "eager_refit", "graph_captured_refit"]
    ar = next(r for r in proj["rows"] if r["backend"] == "ar")
    assert all(ar[v]["speedup_vs_ar"] == 1.0 for v in proj["variants"])
    # the markdown: a status row per stage and each stage's table
    assert "DRY RUN" in md
    for name in gpu_check.STAGE_NAMES:
        assert f"| {name} | ok |" in md
    for head in ("## Environment", "## Exactness on cpu", "## Backends on", "## Forward latency", "PROJECTION",
                 "## Images at released shapes", "## Quantized weights"):
        assert head in md
    assert set(report["plan"]["stages"]) == set(gpu_check.STAGE_NAMES)


def test_a_failing_stage_is_recorded_and_the_next_stage_still_runs(monkeypatch):
    def broken(ctx):
        ctx.result["before_the_failure"] = 1
        raise RuntimeError("planted failure in the environment stage")

    monkeypatch.setitem(stages.STAGES, "environment", broken)
    rep = runner.run_check(options("--no-compile", "--stages", "environment", "exactness", "--samples", "200"),
                           in_process=True)
    env, ex = rep["stages"]["environment"], rep["stages"]["exactness"]
    assert env["status"] == "failed"
    err = env["result"]["error"]
    assert err["type"] == "RuntimeError" and "planted failure" in err["message"] and not err["cuda_error"]
    assert any("broken" in line for line in err["traceback"])
    assert env["result"]["before_the_failure"] == 1  # what the stage had recorded is kept
    assert ex["status"] == "ok" and len(ex["result"]["cases"]) == len(exactness.exactness_cases())
    md = report.markdown(rep)
    assert "| environment | failed |" in md and "planted failure" in md and "| exactness | ok |" in md


def test_a_stage_past_its_budget_is_cut_and_the_next_stage_still_runs(monkeypatch, tmp_path):
    # in this process (SIGALRM), a stage that would run for a minute
    monkeypatch.setitem(stages.STAGES, "environment", lambda ctx: __import__("time").sleep(60))
    rep = runner.run_check(options("--no-compile", "--stages", "environment", "exactness", "--samples", "200",
                                   "--stage-budget", "environment=1"), in_process=True)
    assert rep["stages"]["environment"]["status"] == "timed out"
    assert rep["stages"]["environment"]["seconds"] < 10
    assert rep["stages"]["exactness"]["status"] == "ok"
    # in its own process (the default): killed at its budget, what follows runs
    report, md = cli(tmp_path, "--no-compile", "--stages", "exactness", "environment", "--stage-budget", "exactness=1")
    cut, env = report["stages"]["exactness"], report["stages"]["environment"]
    assert cut["status"] == "timed out" and cut["seconds"] < 10 and cut["budget_s"] == 1
    assert env["status"] == "ok" and env["result"]["torch"]
    assert "| exactness | timed out |" in md


def test_bad_arguments_are_one_error_line(capsys):
    main = tooling.main
    assert main(["gpu-check", "--dry-run", "--stage-budget", "warp=3"]) == 2
    assert "--stage-budget must be STAGE=SECONDS" in capsys.readouterr().err
    assert main(["gpu-check", "--dry-run", "--stage-budget", "backends=-1"]) == 2
    assert "must be > 0" in capsys.readouterr().err
    assert main(["gpu-check", "--dry-run", "--backends", "ar", "warp"]) == 2
    assert "--backends: unknown backend(s) ['warp']; allowed:" in capsys.readouterr().err
    import torch
    if not torch.cuda.is_available():
        assert main(["gpu-check"]) == 2
        assert "no CUDA GPU is available here; run with --dry-run" in capsys.readouterr().err


def test_the_compiled_path_of_one_tiny_case():
    """The backends stage with AR compiled (the dry run's only compiled backend): one graph, no break,
    no recompile, the eager tokens, and dynamo's counters recorded."""
    rep = runner.run_check(options("--stages", "backends"), in_process=True)
    rec = rep["stages"]["backends"]
    assert rec["status"] == "ok", rec["result"].get("error")
    c = rec["result"]["rows"]["ar"]["compiled"]
    assert "error" not in c, c
    if c["eager_fallback"]:
        pytest.skip(f"no compiler here: {c['eager_fallback']}")
    assert c["compiles"] >= 1 and c["recompiles"] == 0 and c["graph_breaks"] == 0
    assert c["tokens_equal_eager"] and c["replay_tokens_equal_first_run"] and c["tokens_compared"]
    assert c["counters"]["stats"]["unique_graphs"] >= 1 and c["compile_s"] > 0
    assert c["tokens_differing"] == 0 and c["first_difference_at"] is None
    # the dry run takes the CUDA-graph buffer handling: the second generation moved its buffers into the homes
    assert c["buffers_rehomed"] > 0 and c["rerecords_replay"] == 0
    assert not capture_mod.GRAPH_BUFFERS_ON_CPU  # restored after the stage
    assert "compiled" not in rec["result"]["rows"]["scd"]  # dry run: AR only


def _synthetic(bw_eff, fl_eff, launch_s, launches=900):
    """Forward latencies made by the roofline model itself with known constants, on a card known
    only by its (measured) peaks, slow enough in FLOPs that long chains are compute-bound."""
    shape = SHAPES["chameleon-7b"]
    env = {"device_name": "Test GPU", "peaks": {"copy_bytes_per_s": 1.0e12, "matmul_flops_per_s": 2.0e13}}
    S = 2480
    s = rl.replace(rl.LUMINA_MGPT_7B, qk_norm=False, head_rows_read=shape["image_codes"])
    gpu = rl.GPU("Test GPU", 1.0e12, 2.0e13, "")
    eff = rl.Efficiency(bw_eff, fl_eff)
    dev = {T: rl.device_seconds(rl.forward_kernels(s, T, 2, S - T), gpu, eff) for T in range(1, 66)}
    measured = {"shape": shape, "dtype": "bfloat16", "device": "cuda", "kv_slots": S,
                "launches": {"1": launches, "65": launches},
                "eager": {str(T): {"forward_ms": 1e3 * (d + launches * launch_s)} for T, d in dev.items()},
                "compiled": {str(T): {"forward_ms": 1e3 * dev[T]} for T in (1, 17, 33, 65)}}
    return measured, env


def test_the_roofline_refit_recovers_known_constants():
    measured, env = _synthetic(0.75, 0.6, 12e-6)
    fit = refit.refit_roofline(measured, env, rl.DEFAULT_BENCH_JSON)
    assert fit["card_source"] == "measured" and fit["card"] == "Test GPU"
    assert (fit["compiled_fit"]["bandwidth_eff"], fit["compiled_fit"]["flops_eff"]) == (0.75, 0.6)
    assert fit["compiled_fit"]["max_abs_rel_error"] < 1e-9
    assert fit["compiled_fit"]["bandwidth_eff_identified"] and fit["compiled_fit"]["flops_eff_identified"]
    assert fit["eager_fit"]["launch_s"] == pytest.approx(12e-6, rel=1e-6)
    assert fit["eager_fit"]["max_abs_rel_error"] < 1e-9
    rows = {r["backend"]: r for r in fit["projection"]["rows"]}
    # graph-captured: no launch term, so faster than eager with the same efficiencies
    assert rows["ar"]["graph_captured_refit"]["seconds"] < rows["ar"]["eager_refit"]["seconds"]
    assert rows["scd"]["eager_refit"]["speedup_vs_ar"] > 1.0
    # on a card whose FLOPs no measured forward reaches, the FLOPs efficiency is not determined: said so,
    # and the assumed default kept
    fast = dict(env, peaks={"copy_bytes_per_s": 1.0e12, "matmul_flops_per_s": 1.0e16})
    memory_bound = refit.refit_roofline(measured, fast, rl.DEFAULT_BENCH_JSON)["compiled_fit"]
    assert not memory_bound["flops_eff_identified"] and memory_bound["flops_eff"] == rl.EFFICIENCY.flops_eff
    # a planted error in the measurements moves the fit
    measured["eager"] = {T: {"forward_ms": v["forward_ms"] * 2} for T, v in measured["eager"].items()}
    assert refit.refit_roofline(measured, env, rl.DEFAULT_BENCH_JSON)["eager_fit"]["launch_s"] > 20e-6


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
                                      ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA H100 PCIe", None),
                                      ("NVIDIA H200", None)])
def test_the_card_is_the_datasheet_one_or_the_measured_one(name, key):
    peaks = {"copy_bytes_per_s": 4e12, "matmul_flops_per_s": 7e14}
    gpu, source = refit.card_of(name, peaks)
    if key:
        assert gpu is rl.GPUS[key] and source == "datasheet"
    else:
        assert source == "measured" and gpu.bandwidth == 4e12 and gpu.bf16_flops == 7e14


def test_a_stage_failing_with_a_cuda_error_is_rerun_with_blocking_launches(monkeypatch):
    calls = []

    def fake_process(name, options, budget, previous, workdir, extra_env=None, progress=None):
        calls.append((name, extra_env))
        err = {"type": "RuntimeError", "message": "CUDA error: device-side assert triggered", "cuda_error": True,
               "traceback": []}
        failed = name == "exactness"
        return {"status": "failed" if failed else "ok", "result": {"error": err} if failed else {}, "seconds": 1.0}

    monkeypatch.setattr(runner, "run_stage_process", fake_process)
    rep = runner.run_check(options("--no-compile", "--stages", "exactness", "backends"))
    # the rerun comes after every stage has had its turn: it cannot starve a later stage of its budget
    assert calls == [("exactness", None), ("backends", None), ("exactness", {"CUDA_LAUNCH_BLOCKING": "1"})]
    assert rep["stages"]["exactness"]["blocking_rerun"]["status"] == "failed"
    assert "blocking_rerun" not in rep["stages"]["backends"]
    assert "exactness (rerun, CUDA_LAUNCH_BLOCKING=1)" in report.markdown(rep)


def test_a_cuda_error_recorded_for_one_item_also_counts():
    ok_with_item_error = {"status": "ok", "result": {"rows": {"ar": {"compiled": {"error": "RuntimeError: CUDA error: "
                                                                                            "an illegal memory access"}}}}}
    assert runner.had_cuda_error(ok_with_item_error)
    assert not runner.had_cuda_error({"status": "failed", "result": {"error": {"message": "ValueError: bad",
                                                                                  "cuda_error": False}}})


def test_backends_and_compiled_token_counts_can_be_chosen():
    """A GPU lease is short: `--backends` and `--compiled-tokens-7b` pick what the stages run, in order."""
    opt = options("--backends", "scd", "ar", "--compiled-tokens-7b", "33", "1")
    assert opt["backends"] == ["scd", "ar"] and opt["compiled_tokens_7b"] == [33, 1]
    rep = runner.run_check(dict(opt, stages=["backends"], compile=False), in_process=True)
    assert list(rep["stages"]["backends"]["result"]["rows"]) == ["scd", "ar"]


@pytest.fixture
def ninth_backend():
    """A 9th backend in the registry (SJD's Method under another name: it runs), patched in and restored."""
    ninth = dataclasses.replace(SCHEMAS["sjd"], name="sjd_ninth", label="SJD, registered again")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "METHODS", registry.METHODS + (ninth,))
        mp.setitem(registry.SCHEMAS, ninth.name, ninth)
        mp.setattr(registry, "BACKENDS", tuple(registry.SCHEMAS))
        yield ninth.name


def test_a_backend_registered_in_methods_is_in_the_gpu_check(ninth_backend):
    """No list of backends in gpu-check: a 9th registered backend is planned (eager and, on CUDA, compiled among
    those no GPU has compiled, right after AR's), gets an exactness case, and runs in the backends stage."""
    dry = options("--no-compile", "--stages", "exactness", "backends")
    assert ninth_backend in dry["backends"]
    items = [i["item"] for i in dry["plan"]["stages"]["backends"]["items"]]
    assert f"eager {ninth_backend}" in items
    cases = [i["item"] for i in dry["plan"]["stages"]["exactness"]["items"]]
    assert any(case.startswith(f"chi-square {ninth_backend} ") for case in cases)
    gpu = options("--plan-only", "--stages", "backends", "images", dry=False)
    measured = plan.compiled_on_a_gpu(plan.committed_reports())
    order = gpu["compile_backends"]
    assert order[0] == plan.RATIO_BASE and ninth_backend in order
    assert all(order.index(ninth_backend) < order.index(b) for b in measured if b != plan.RATIO_BASE)
    assert f"compiled {ninth_backend}" in [i["item"] for i in gpu["plan"]["stages"]["backends"]["items"]]
    images = [i["item"] for i in gpu["plan"]["stages"]["images"]["items"]]
    assert any(i.startswith(f"janus-pro-7b: eager {ninth_backend},") for i in images)
    rep = runner.run_check(dict(dry, stages=["backends"]), in_process=True)
    row = rep["stages"]["backends"]["result"]["rows"][ninth_backend]
    assert row["eager"]["latency_s"] > 0 and row["eager"]["speedup_vs_ar"] > 0


def test_a_backends_stage_cut_mid_way_keeps_the_ratios_of_its_finished_rows(monkeypatch):
    """The stage's budget ends during the third backend (the cut as SIGALRM delivers it): the rows before it
    already carry their ratio to AR's latency."""
    from specar.samplers import api
    real, calls = api.generate, []

    def cut_on_the_fourth_call(*a, **kw):  # the untimed first generation, then AR, then one more backend
        calls.append(kw.get("backend"))
        if len(calls) == 4:
            raise runner.StageTimeout("planted: the stage's budget ends here")
        return real(*a, **kw)

    monkeypatch.setattr(api, "generate", cut_on_the_fourth_call)
    rep = runner.run_check(options("--no-compile", "--stages", "backends"), in_process=True)
    rec = rep["stages"]["backends"]
    assert rec["status"] == "timed out"
    done = {b: row for b, row in rec["result"]["rows"].items() if "latency_s" in row.get("eager", {})}
    assert list(done) == calls[1:3] and done[plan.RATIO_BASE]["eager"]["speedup_vs_ar"] == 1.0
    other = done[calls[2]]["eager"]
    assert other["speedup_vs_ar"] == done[plan.RATIO_BASE]["eager"]["latency_s"] / other["latency_s"]
    assert f"| {calls[2]} | " in report.markdown(rep)  # the partial stage's table is written


def test_the_report_is_written_while_a_stage_process_runs(monkeypatch, tmp_path):
    """A command killed from outside (a lease's time limit) leaves the report of what ran so far."""
    monkeypatch.setattr(runner, "PROGRESS_S", 0.5)
    seen = []

    def update(rep):
        seen.append(json.loads(json.dumps(rep, default=runner.json_default)))
        gpu_check.write_report(rep, str(tmp_path))

    rep = runner.run_check(options("--no-compile", "--stages", "environment"), on_update=update)
    assert rep["stages"]["environment"]["status"] == "ok"
    assert any(r["stages"].get("environment", {}).get("status") == "running" for r in seen), seen
    assert seen[-1]["stages"]["environment"]["status"] == "ok"
    assert "| environment | ok |" in (tmp_path / "gpu_check.md").read_text()
    assert json.loads((tmp_path / "gpu_check.json").read_text())["stages"]["environment"]["status"] == "ok"


def _report(order, eager_s, compiled_s, cut=None, stage_s=100.0):
    """A committed report: the backends stage with these eager and compiled seconds, `cut` compiling when its budget
    ended; an exactness stage whose process start is 3 s."""
    rows = {b: {"eager": {"wall_s": eager_s[b]}} for b in order}
    for b, s in compiled_s.items():
        rows[b]["compiled"] = {"first_run_s": s - 1.0, "wall_s": 1.0, "latency_s": 1.0}
    cases = [{"backend": "ar", "seconds": 2.0, "samples": 1000}]
    return {"meta": {"dry_run": False}, "stages": {
        "exactness": {"status": "ok", "seconds": 5.0, "result": {"cases": cases}},
        "backends": {"status": "timed out" if cut else "ok", "seconds": stage_s,
                     "result": {"first_generation_s": 4.0, "rows": rows}}}}


def test_the_plan_predicts_each_stage_from_committed_reports():
    order = list(SCHEMAS)
    measured = order[:3]  # AR and two others compiled, the fourth cut while compiling
    eager_s = {b: 1.0 + i for i, b in enumerate(order)}
    compiled_s = {b: 10.0 * (i + 1) for i, b in enumerate(measured)}
    committed = _report(order, eager_s, compiled_s, cut=order[3], stage_s=200.0)
    opt = options("--plan-only", "--stages", "exactness", "backends", "--stage-budget", "backends=100",
                  "--samples", "500", dry=False, reports=[("committed.json", committed)])
    want_order = [order[0]] + [b for b in order[1:] if b not in measured] + measured[1:]
    assert opt["backends"] == want_order
    p = opt["plan"]["stages"]
    ex = {i["item"]: i for i in p["exactness"]["items"]}
    assert ex["process start"]["predicted_s"] == 5.0 - 2.0
    assert next(i for k, i in ex.items() if k.startswith("chi-square ar "))["predicted_s"] == 2.0 / 1000 * 500
    items = {i["item"]: i for i in p["backends"]["items"]}
    for b in order:
        assert items[f"eager {b}"]["predicted_s"] == eager_s[b]
    for b in measured:
        assert items[f"compiled {b}"]["predicted_s"] == compiled_s[b] and "estimated" not in items[f"compiled {b}"]
    # the compile cut by the budget took at least what was left of the stage; the others: the slowest measured
    left = 200.0 - 3.0 - 4.0 - sum(eager_s.values()) - sum(compiled_s.values())
    assert items[f"compiled {order[3]}"]["predicted_s"] == round(max(left, max(compiled_s.values())), 1)
    assert all(items[f"compiled {b}"]["predicted_s"] == max(compiled_s.values()) and items[f"compiled {b}"]["estimated"]
               for b in order[4:])
    total = sum(i["predicted_s"] for i in p["backends"]["items"])
    assert p["backends"]["predicted_s"] == pytest.approx(total, abs=0.1)
    # the items past the stage's budget, in order
    spent, cut = 0.0, []
    for i in p["backends"]["items"]:
        spent += i["predicted_s"]
        cut += [i["item"]] if spent > 100.0 else []
    assert p["backends"]["cut"] == cut and cut
    assert "PREDICTED PAST ITS BUDGET" in plan.plan_text(opt["plan"])


def test_plan_only_needs_no_gpu_and_prints_every_stage_against_its_budget(capsys):
    assert tooling.main(["gpu-check", "--plan-only", "--out", "never-written"]) == 0
    out = capsys.readouterr().out
    for name in gpu_check.PROFILES["cuda"]["stages"]:  # the default run's stages
        budget = gpu_check.PROFILES["cuda"]["budgets"][name]
        assert any(line.split()[:2] == [name, f"{budget:.0f}"] for line in out.splitlines()), (name, out)
    assert "backends, in order: " + " ".join(plan.backend_order(plan.committed_reports())) in out
