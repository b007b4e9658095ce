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
    from specar.model_loaders.tiny import tiny_model
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
    from specar.model_loaders.tiny import tiny_model
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
