"""`python -m specar.tooling shape-bench --small` (7B-shape forwards at a small size against the sampling core's
cost) and `compile-rows` (both product forms of the compiled forward), end to end on the CPU."""
import json
import subprocess
import sys

import pytest


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
