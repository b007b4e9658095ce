"""The benchmark command runs every configuration and writes the documented JSON rows."""
import json
import subprocess
import sys

import pytest

from specar import benchmark


def test_parse_config_types_and_validation():
    assert benchmark.parse_config("sjd_pac:window=64,tree_width=3,continuation=false") == {
        "backend": "sjd_pac", "window": 64, "tree_width": 3, "continuation": False}
    assert benchmark.parse_config("scd:coupling_strength=0.5") == {"backend": "scd", "coupling_strength": 0.5}
    with pytest.raises(ValueError, match="window"):
        benchmark.parse_config("sjd:window=0")
    with pytest.raises(ValueError, match="unknown backend"):
        benchmark.parse_config("eagle")


def test_bench_command_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "specar", "bench", "--model", "tiny:8,4x4,row_end", "--seeds", "0",
           "--backends", "ar", "sjd:window=8", "sjd_pac:window=8,tree_width=2", "--quiet", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["backend"] for r in rows] == ["ar", "sjd", "sjd_pac"]
    for r in rows:
        for key in ("backend", "params", "nfe", "step_compression", "latency_s", "speedup_vs_ar"):
            assert key in r
    assert rows[0]["speedup_vs_ar"] == pytest.approx(1.0) and rows[0]["step_compression"] == pytest.approx(1.0)
    assert data["meta"]["command"].startswith("python -m specar bench")
    assert "ar " in res.stdout or res.stdout.splitlines()[2].startswith("ar")


def test_shape_bench_small_runs(tmp_path):
    out = tmp_path / "shape.json"
    cmd = [sys.executable, "-m", "specar", "shape-bench", "--small", "--device", "cpu", "--dtype", "float32",
           "--context", "64", "--windows", "1", "16", "--repeats", "2", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["window"] for r in rows] == [1, 16]
    assert all(r["forward_ms"] > 0 and r["core_ms"] > 0 for r in rows)


def test_demo_command_saves_pictures(tmp_path):
    cmd = [sys.executable, "-m", "specar", "demo", "--model", "tiny:8,4x4,row_end", "--prompts", "a", "b",
           "--fast", "sjd:window=8", "--out", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00_ar.png", "00_sjd.png", "01_ar.png", "01_sjd.png", "demo.json", "grid.png"]
    assert "faster" in res.stdout
