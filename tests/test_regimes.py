"""Benchmark regimes (cli/regimes.py): each builds and runs, the bench shows it (the paper regime's calibration
search: tooling/tests/test_calibrate_regime.py)."""
import json
import subprocess
import sys

import pytest

from specar.cli import bench, benchmark, call, regimes
from specar.cli.benchmark import parse_config
from specar.cli.model_spec import model_from_spec as _model


def test_every_regime_builds_and_names_its_settings():
    for name in regimes.REGIMES:
        r = regimes.regime(name)
        assert r.name == name and r.model and r.sampling
        assert name in r.summary() and r.model in r.summary()
        assert json.loads(json.dumps(r.as_dict()))["name"] == name
    with pytest.raises(ValueError, match="unknown regime 'nope'; regimes: demo, paper, flat"):
        regimes.regime("nope")


def test_paper_regime_reads_its_calibration():
    cal = regimes.read_calibration("paper")
    r = regimes.regime("paper")
    assert r.sampling["temperature"] == cal["sampling"]["temperature"]
    assert r.run_options == {"reproducible": False}  # the papers' own rejection sampling, as calibrated
    assert r.apply_run_options([{"backend": "sjd"}, {"backend": "ar", "reproducible": True}]) == [
        {"backend": "sjd", "reproducible": False}, {"backend": "ar", "reproducible": True}]


def test_bad_calibration_file_is_reported(tmp_path):
    with pytest.raises(ValueError, match="run `python -m specar.tooling calibrate-regime paper`"):
        regimes.read_calibration("paper", str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"sampling": {"temperature": -1}}')
    with pytest.raises(ValueError, match="no positive sampling.temperature"):
        regimes.read_calibration("paper", str(bad))
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read its calibration"):
        regimes.read_calibration("paper", str(bad))


def test_flat_regime_model_is_flat_and_large():
    model = _model(regimes.FLAT_MODEL, None, None)
    geo = model.geometry
    assert geo.vocab_size >= 4096 and geo.height * geo.width > 64 and geo.row_end
    assert regimes.FLAT_SAMPLING["top_k"] < geo.vocab_size


def test_tiny_spec_options_and_errors():
    m = _model("tiny:32,3x5,row_end,hidden=8,layers=1,heads=1,scale=0.5,seed=3", None, None)
    assert (m.geometry.vocab_size, m.geometry.height, m.geometry.width, m.geometry.row_end) == (32, 3, 5, True)
    assert m.random_drafter_seed == 3
    for bad in ("tiny:32,3x5,depth=2", "tiny:32", "tiny:x,3x5", "tiny:32,3x5,scale=big"):
        with pytest.raises(ValueError, match="bad tiny model spec"):
            _model(bad, None, None)


def test_regime_excludes_model_and_sampling_options():
    assert bench.chosen_regime(None, None, {}).name == "demo"  # nothing given: today's bench
    assert bench.chosen_regime(None, "tiny:8,4x4", {}) is None  # a custom run
    assert bench.chosen_regime("flat", None, {}).model == regimes.FLAT_MODEL
    with pytest.raises(ValueError, match="--regime paper fixes the model and the sampling settings; drop --model, "
                                         "--temperature"):
        bench.chosen_regime("paper", "demo", {"temperature": 2.0})


@pytest.mark.parametrize("name", list(regimes.REGIMES))
def test_each_regime_runs_ar_and_sjd(name):
    """One image of ar and sjd (window 4) in the regime's model and sampling, through the bench's run()."""
    r = regimes.regime(name)
    model = _model(r.model, None, None)
    configs = r.apply_run_options([parse_config("ar"), parse_config("sjd:preset=paper,window=4")])
    rows = benchmark.run(model, configs, ["a red circle"], [0], warmup=False, sampling=r.sampling)
    assert [row["backend"] for row in rows] == ["ar", "sjd"]
    assert rows[0]["step_compression"] == pytest.approx(1.0)
    assert rows[1]["step_compression"] >= 1.0 and rows[1]["nfe"] <= rows[0]["nfe"]
    assert all(row["reproducible"] == r.run_options.get("reproducible", True) for row in rows)


def test_bench_command_shows_the_regime(tmp_path):
    """`python -m specar bench --regime flat` (its own process, as a user runs it): the regime is in the JSON's
    meta and on stdout; with --model it is refused before any work."""
    out, prompts = tmp_path / "bench.json", tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    cmd = [sys.executable, "-m", "specar", "bench", "--regime", "flat", "--backends", "ar", "sjd:window=4", "--seeds",
           "0", "--prompts", str(prompts), "--threads", "1", "--quiet", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    meta = json.loads(out.read_text())["meta"]
    assert meta["regime"]["name"] == "flat" and meta["model"] == regimes.FLAT_MODEL
    assert meta["sampling"] == regimes.FLAT_SAMPLING
    summary = regimes.regime("flat").summary()
    assert summary.startswith("regime: flat (model tiny:8192,16x16") and summary in res.stdout.splitlines()
    with pytest.raises(ValueError, match="--regime flat fixes the model"):
        call(["bench", "--regime", "flat", "--model", "demo", "--backends", "ar"])
