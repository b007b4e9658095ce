"""The paper regime's calibration (tooling/calibrate_regime.py): the checked-in calibration is one of its
evaluations, the search lands where it says, and the command refuses bad bounds."""
import pytest

from specar import tooling
from specar.cli import regimes
from specar.cli.benchmark import parse_config
from specar.cli.model_spec import model_from_spec as _model
from specar.tooling import calibrate_regime


def test_checked_in_calibration_is_one_of_its_evaluations():
    """cli/regime_paper.json: the temperature it gives was measured (one of its evaluations), at the value it
    reports, within its tolerance of the target, on the metric the papers use."""
    cal = regimes.read_calibration("paper")
    chosen = [e for e in cal["evaluations"] if e["temperature"] == cal["sampling"]["temperature"]]
    assert len(chosen) == 1 and chosen[0]["step_compression"] == cal["step_compression"]
    assert cal["reached"] and abs(cal["step_compression"] - cal["target"]) <= cal["tolerance"] * cal["target"]
    assert cal["metric"] == calibrate_regime.CALIBRATED_METRIC and cal["probe"] == calibrate_regime.PAPER_PROBE


def test_calibration_lands_where_it_says_on_a_tiny_target():
    """The search on a tiny flat target: the temperature it returns, measured again, gives the step
    compression it reports, within the tolerance of the target; a target out of reach is refused."""
    model = _model("tiny:64,4x4,row_end,hidden=16,scale=3.0", None, None)
    probe = parse_config("sjd:preset=paper,window=8,reproducible=false")
    fixed = {"cfg_scale": 1.0, "top_k": 0}

    def measure(t):
        return calibrate_regime.measure_step_compression(model, probe, ["a", "b"], [0, 1, 2], {**fixed, "temperature": t})[
            "step_compression"]

    lo, hi = measure(0.5), measure(8.0)
    target = (lo + hi) / 2  # between the ends: reachable by a continuous search
    found = calibrate_regime.calibrate_temperature(measure, target, 0.5, 8.0, tolerance=0.05, max_evaluations=14)
    assert found["evaluations"][0]["temperature"] == 0.5 and len(found["evaluations"]) <= 14
    assert measure(found["temperature"]) == pytest.approx(found["step_compression"])  # lands where it says
    assert found["reached"] and abs(found["step_compression"] - target) <= 0.05 * target
    with pytest.raises(ValueError, match="is not between"):
        calibrate_regime.calibrate_temperature(measure, max(lo, hi) + 5.0, 0.5, 8.0)


def test_calibrate_command_refuses_bad_bounds(tmp_path, capsys):
    """`python -m specar.tooling calibrate-regime`: bad bounds are one error line, before any model is loaded."""
    out = tmp_path / "cal.json"
    assert tooling.main(["calibrate-regime", "paper", "--lo", "4", "--hi", "2", "--out", str(out)]) == 2
    assert "--lo (4.0) must be below --hi (2.0)" in capsys.readouterr().err
    assert tooling.main(["calibrate-regime", "flat"]) == 2  # only `paper` is calibrated
    assert not out.exists()
