"""`python -m specar gpu-check`: its dry run end to end on the CPU (the report's structure), stage
isolation (a failing stage is recorded and the next one runs; a stage past its budget is cut),
the compiled path of one tiny case, and the roofline refit recovering known constants.

No GPU here: these tests check the command itself; its CUDA figures come from a GPU (docs/BENCHMARKS.md)."""
import json
import subprocess
import sys

import pytest

from specar.cli import gpu_check, gpu_refit, gpu_stages
from specar.cli import roofline as rl
from specar.cli.args import parse_command
from specar.model_loaders import capture as capture_mod
from specar.samplers.backends import SCHEMAS


def options(*argv):
    return gpu_check.options_from_args(parse_command("gpu-check", gpu_check.__doc__, gpu_check.add_arguments,
                                                     ["--dry-run", *argv]))


def cli(tmp_path, *argv, timeout=240):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "specar", "gpu-check", "--dry-run", "--out", str(out), *argv],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "gpu_check.json") as f:
        report = json.load(f)
    return report, (out / "gpu_check.md").read_text()


def test_dry_run_end_to_end_writes_the_json_and_the_markdown(tmp_path):
    report, md = cli(tmp_path, "--no-compile", "--samples", "300")
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
    assert [c["backend"] for c in ex["cases"]] == ["ar", "scd", "sjd_pac", "hawk", "adt_tree", "sjd_pac"]
    # each backend's own rejection sampling (what the planted residual bug breaks), then the agreement mode
    assert [c["params"]["reproducible"] for c in ex["cases"]] == [False] * 5 + [True]
    for c in ex["cases"]:
        assert 0 <= c["p_value"] <= 1 and c["samples"] == 300 and c["passed"] == (c["p_value"] > ex["p_fail"])
    assert len(ex["cases"]) * ex["p_fail"] < 1e-4  # the stage's false-failure bound
    assert "p_value" in ex["planted_wrong_residual"]
    rows = st["backends"]["result"]["rows"]
    assert set(rows) == set(SCHEMAS)
    for b, row in rows.items():
        assert row["eager"]["latency_s"] > 0 and row["eager"]["forwards"] >= 1, b
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
    for head in ("## Environment", "## Exactness on cpu", "## Backends on", "## Forward latency", "PROJECTION"):
        assert head in md


def test_a_failing_stage_is_recorded_and_the_next_stage_still_runs(monkeypatch):
    def broken(ctx):
        ctx.result["before_the_failure"] = 1
        raise RuntimeError("planted failure in the environment stage")

    monkeypatch.setitem(gpu_stages.STAGES, "environment", broken)
    report = gpu_check.run_check(options("--no-compile", "--stages", "environment", "exactness", "--samples", "200"),
                                 in_process=True)
    env, ex = report["stages"]["environment"], report["stages"]["exactness"]
    assert env["status"] == "failed"
    err = env["result"]["error"]
    assert err["type"] == "RuntimeError" and "planted failure" in err["message"] and not err["cuda_error"]
    assert any("broken" in line for line in err["traceback"])
    assert env["result"]["before_the_failure"] == 1  # what the stage had recorded is kept
    assert ex["status"] == "ok" and len(ex["result"]["cases"]) == len(gpu_stages.EXACTNESS_CASES)
    md = gpu_check.markdown(report)
    assert "| environment | failed |" in md and "planted failure" in md and "| exactness | ok |" in md


def test_a_stage_past_its_budget_is_cut_and_the_next_stage_still_runs(monkeypatch, tmp_path):
    # in this process (SIGALRM), a stage that would run for a minute
    monkeypatch.setitem(gpu_stages.STAGES, "environment", lambda ctx: __import__("time").sleep(60))
    report = gpu_check.run_check(options("--no-compile", "--stages", "environment", "exactness", "--samples", "200",
                                         "--stage-budget", "environment=1"), in_process=True)
    assert report["stages"]["environment"]["status"] == "timed out"
    assert report["stages"]["environment"]["seconds"] < 10
    assert report["stages"]["exactness"]["status"] == "ok"
    # in its own process (the default): killed at its budget, what follows runs
    report, md = cli(tmp_path, "--no-compile", "--stages", "exactness", "environment", "--stage-budget", "exactness=1")
    cut, env = report["stages"]["exactness"], report["stages"]["environment"]
    assert cut["status"] == "timed out" and cut["seconds"] < 10 and cut["budget_s"] == 1
    assert env["status"] == "ok" and env["result"]["torch"]
    assert "| exactness | timed out |" in md


def test_bad_arguments_are_one_error_line(capsys):
    from specar.cli import main
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
    report = gpu_check.run_check(options("--stages", "backends"), in_process=True)
    rec = report["stages"]["backends"]
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
    shape = gpu_stages.SHAPE_7B
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
    fit = gpu_refit.refit_roofline(measured, env, gpu_check.DEFAULT_BENCH_JSON)
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
    memory_bound = gpu_refit.refit_roofline(measured, fast, gpu_check.DEFAULT_BENCH_JSON)["compiled_fit"]
    assert not memory_bound["flops_eff_identified"] and memory_bound["flops_eff"] == rl.EFFICIENCY.flops_eff
    # a planted error in the measurements moves the fit
    measured["eager"] = {T: {"forward_ms": v["forward_ms"] * 2} for T, v in measured["eager"].items()}
    assert gpu_refit.refit_roofline(measured, env, gpu_check.DEFAULT_BENCH_JSON)["eager_fit"]["launch_s"] > 20e-6


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
                                      ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA H100 PCIe", None),
                                      ("NVIDIA H200", None)])
def test_the_card_is_the_datasheet_one_or_the_measured_one(name, key):
    peaks = {"copy_bytes_per_s": 4e12, "matmul_flops_per_s": 7e14}
    gpu, source = gpu_refit.card_of(name, peaks)
    if key:
        assert gpu is rl.GPUS[key] and source == "datasheet"
    else:
        assert source == "measured" and gpu.bandwidth == 4e12 and gpu.bf16_flops == 7e14


def test_a_stage_failing_with_a_cuda_error_is_rerun_with_blocking_launches(monkeypatch):
    calls = []

    def fake_process(name, options, budget, previous, workdir, extra_env=None):
        calls.append((name, extra_env))
        err = {"type": "RuntimeError", "message": "CUDA error: device-side assert triggered", "cuda_error": True,
               "traceback": []}
        failed = name == "exactness"
        return {"status": "failed" if failed else "ok", "result": {"error": err} if failed else {}, "seconds": 1.0}

    monkeypatch.setattr(gpu_check, "run_stage_process", fake_process)
    report = gpu_check.run_check(options("--no-compile", "--stages", "exactness", "backends"))
    # the rerun comes after every stage has had its turn: it cannot starve a later stage of its budget
    assert calls == [("exactness", None), ("backends", None), ("exactness", {"CUDA_LAUNCH_BLOCKING": "1"})]
    assert report["stages"]["exactness"]["blocking_rerun"]["status"] == "failed"
    assert "blocking_rerun" not in report["stages"]["backends"]
    assert "exactness (rerun, CUDA_LAUNCH_BLOCKING=1)" in gpu_check.markdown(report)


def test_a_cuda_error_recorded_for_one_item_also_counts():
    ok_with_item_error = {"status": "ok", "result": {"rows": {"ar": {"compiled": {"error": "RuntimeError: CUDA error: "
                                                                                            "an illegal memory access"}}}}}
    assert gpu_check.had_cuda_error(ok_with_item_error)
    assert not gpu_check.had_cuda_error({"status": "failed", "result": {"error": {"message": "ValueError: bad",
                                                                                  "cuda_error": False}}})


def test_backends_and_compiled_token_counts_can_be_chosen():
    """A GPU lease is short: `--backends` and `--compiled-tokens-7b` pick what the stages run, in order."""
    opt = options("--backends", "scd", "ar", "--compiled-tokens-7b", "33", "1")
    assert opt["backends"] == ["scd", "ar"] and opt["compiled_tokens_7b"] == [33, 1]
    report = gpu_check.run_check(dict(opt, stages=["backends"], compile=False), in_process=True)
    assert list(report["stages"]["backends"]["result"]["rows"]) == ["scd", "ar"]
