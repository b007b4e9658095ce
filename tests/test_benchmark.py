"""The benchmark command runs every configuration and writes the documented JSON rows."""
import json
import subprocess
import sys

import pytest

from specar.cli import benchmark


def test_parse_config_types_and_validation():
    assert benchmark.parse_config("sjd_pac:window=64,tree_width=3,continuation=false") == {
        "backend": "sjd_pac", "window": 64, "tree_width": 3, "continuation": False}
    assert benchmark.parse_config("scd:coupling_strength=0.5") == {"backend": "scd", "coupling_strength": 0.5}
    with pytest.raises(ValueError, match="window"):
        benchmark.parse_config("sjd:window=0")
    with pytest.raises(ValueError, match="unknown backend"):
        benchmark.parse_config("eagle")


def test_windows_expand_configs_without_a_window():
    configs = [benchmark.parse_config(c) for c in ("ar", "sjd", "scd:coupling=gumbel", "sjd_pac:window=8")]
    labels = [benchmark.label(c) for c in benchmark.with_windows(configs, [4, 16])]
    assert labels == ["ar", "sjd:window=4", "sjd:window=16", "scd:coupling=gumbel,window=4",
                      "scd:coupling=gumbel,window=16", "sjd_pac:window=8"]
    assert benchmark.with_windows(configs, None) == configs
    with pytest.raises(ValueError, match="window"):
        benchmark.with_windows(configs, [0])


def test_bench_command_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "specar", "bench", "--model", "tiny:8,4x4,row_end", "--seeds", "0",
           "--backends", "ar", "sjd", "sjd_pac:window=8,tree_width=2", "--windows", "8", "--quiet", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["label"] for r in rows] == ["ar", "sjd:window=8", "sjd_pac:window=8,tree_width=2"]
    for r in rows:
        for key in ("backend", "params", "nfe", "step_compression", "latency_s", "speedup_vs_ar"):
            assert key in r
    assert rows[0]["speedup_vs_ar"] == pytest.approx(1.0) and rows[0]["step_compression"] == pytest.approx(1.0)
    assert data["meta"]["command"].startswith("python -m specar bench")
    table = res.stdout.splitlines()
    assert table[2].startswith("ar ") and table[3].startswith("sjd:window=8 ")
    # each configuration's histogram is printed, and its counts add up to the steps of its runs
    hist_line = next(line for line in table[6:] if line.startswith("sjd:window=8 "))
    counts = [int(item.split(":")[1]) for item in hist_line.split()[1:]]
    assert sum(counts) == sum(rows[1]["accepted_length_histogram"].values()) > 0


@pytest.mark.long  # a CLI run of minutes on a loaded 2-core machine: make test-long
def test_shape_bench_small_runs(tmp_path):
    out = tmp_path / "shape.json"
    cmd = [sys.executable, "-m", "specar.tooling", "shape-bench", "--small", "--device", "cpu", "--dtype", "float32",
           "--context", "64", "--windows", "1", "16", "--repeats", "2", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert [r["window"] for r in data["rows"]] == [1, 16]
    assert all(r["forward_ms"] > 0 for r in data["rows"])
    core = {(c["backend"], c["window"]): c for c in data["core"]}
    assert {("ar", 1), ("sjd", 16), ("sjd", 64), ("sjd_pac", 64)} <= set(core)
    for c in core.values():
        assert c["core_ms"] > 0 and 0 < c["core_share"] < 1
    # the engine really ran speculative steps on the free-forward model
    assert core[("ar", 1)]["step_compression_free_model"] == pytest.approx(1.0)
    assert core[("sjd", 16)]["step_compression_free_model"] > 1.0
    # a config's forward cost is the one of the nearest measured window at or above its own
    assert core[("sjd", 16)]["forward_ms_at_window"] == data["rows"][1]["forward_ms"]


@pytest.mark.long  # make test-long
def test_compile_rows_times_both_product_forms(tmp_path):
    out = tmp_path / "rows.json"
    cmd = [sys.executable, "-m", "specar.tooling", "compile-rows", "--model", "tiny:16,4x4", "--tokens", "1", "3",
           "--calls", "2", "--rounds", "1", "--threads", "1", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert [(r["tokens"], r["rows"]) for r in data["rows"]] == [(1, 2), (3, 6)]
    assert all(r[k] > 0 for r in data["rows"] for k in ("eager_ms", "gemm_ms", "mul-sum_ms"))
    assert "multiply-and-sum faster at rows:" in res.stdout


def test_demo_command_saves_pictures(tmp_path):
    cmd = [sys.executable, "-m", "specar", "demo", "--model", "tiny:8,4x4,row_end", "--prompts", "a", "b",
           "--fast", "sjd:window=8", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00_ar.png", "00_sjd.png", "01_ar.png", "01_sjd.png", "demo.json", "grid.png"]
    assert "faster" in res.stdout


def test_lossy_rows_are_marked():
    from specar.cli import benchmark
    from specar.tooling.testing import tiny_model
    model = tiny_model(16, (2, 3), seed=0, row_end=True)
    model.random_drafter_seed = 0
    configs = [benchmark.parse_config("adt_tree:node_budget=4,depth=2,width=2,candidate_mode=topk,relaxed=true,relaxed_delta=0.3"),
               benchmark.parse_config("adt_tree:node_budget=4,depth=2,width=2")]
    rows = benchmark.run(model, configs, ["x"], [0], warmup=False)
    assert rows[0]["lossy"] and rows[0]["label"].endswith("(LOSSY)")
    assert not rows[1]["lossy"] and "LOSSY" not in rows[1]["label"]


def test_preview_rows_measure_the_overhead_within_the_run(monkeypatch):
    from specar.cli import benchmark
    from specar.samplers import preview
    from specar.tooling.testing import tiny_model
    # the first preview as soon as possible (the node waits 0.25 s; this run is shorter than that)
    monkeypatch.setitem(preview.PREVIEW_THROTTLE, "min_interval_s", 0.0)
    model = tiny_model(16, (2, 3), seed=0)
    rows = benchmark.run(model, [benchmark.parse_config("sjd:window=2")], ["x"], [0, 1], warmup=False, preview=True)
    assert [r["label"] for r in rows] == ["sjd:window=2", "sjd:window=2 +preview"]
    plain, pv = rows
    assert plain["preview_overhead"] is None and pv["previews"] is not None
    assert pv["preview_overhead"] == pv["latency_median_s"] / plain["latency_median_s"] - 1
    assert pv["nfe"] == plain["nfe"]  # the preview never changes what is sampled
    assert "median latency with / without" in benchmark.format_table(rows)
    assert plain["preview_time_share"] is None and pv["previews"] >= 1
    assert 0 < pv["preview_time_share"] < 1  # the preview's own seconds over the generation's
