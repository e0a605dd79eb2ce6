"""The committed validation table (validation/validation_errors.csv) is what `sim validate` gives
with the bundled calibration, and README's headline is that table's MAPE.

The whole table takes minutes (it is remade by `sim validate --out validation/validation_errors.csv`,
at the default run length the calibration was made at); the test recomputes the points that take a fraction of a
second (the memory breakdown, whose cross-validated figure comes from a fold without them,
and a [FLASH] Table 3 point) and the headline from the committed rows.
"""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from sim.bundled import bundled_dir
from sim.calibrate.calibration import load_calibration
from sim.calibrate.report import ERROR_COLUMNS, calibrated_table, mapes
from sim.engine.config import DEFAULT_DECODE_TOKENS
from sim.validation import validate

TABLE = bundled_dir("validation") / "validation_errors.csv"
README = bundled_dir("validation").parent / "README.md"
CHEAP = ["pi2-mixtral-7gb-mem-cache", "pi2-mixtral-7gb-mem-predictors", "flash-opt-compute"]


@pytest.fixture(scope="module")
def committed() -> pd.DataFrame:
    return pd.read_csv(TABLE).set_index("id")


def test_the_committed_table_covers_the_calibration_and_matches_its_run_length(committed):
    cal = load_calibration(None)
    assert cal is not None and cal.folds, "the bundled calibration has cross-validation folds"
    assert set(cal.points) <= set(committed.index)
    assert int(cal.meta["decode_tokens"]) == DEFAULT_DECODE_TOKENS  # README's command's (the default) run length


@pytest.mark.parametrize("point", CHEAP)
def test_points_of_the_table_recompute_to_the_committed_errors(committed, point):
    cal = load_calibration(None)
    fresh = calibrated_table(validate([point], decode_tokens=int(cal.meta["decode_tokens"])), cal,
                             decode_tokens=int(cal.meta["decode_tokens"])).set_index("id")
    for column in ERROR_COLUMNS:
        assert fresh.at[point, column] == pytest.approx(committed.at[point, column], rel=1e-6, abs=1e-9), column


def test_readme_headline_is_the_committed_tables_mape(committed):
    figures = mapes(committed.reset_index())
    assert figures["cross_validated"] and set(load_calibration(None).points) <= set(committed.index)
    text = README.read_text(encoding="utf-8")
    head = re.search(r"cross-validated MAPE ([\d.]+)%\*\* over the (\d+) points.*?\(in-sample ([\d.]+)%, "
                     r"uncalibrated ([\d.]+)%", text, re.S)
    assert head, "README's validation headline is missing"
    cv, n, in_sample, uncalibrated = float(head[1]), int(head[2]), float(head[3]), float(head[4])
    assert n == figures["points"]
    for shown, key in ((cv, "mape_cv_pct"), (in_sample, "mape_in_sample_pct"),
                       (uncalibrated, "mape_uncalibrated_pct")):
        assert math.isclose(shown, round(figures[key], 1), abs_tol=0.05), key


def test_a_point_the_calibration_cannot_run_is_reported_failed_in_its_row(monkeypatch):
    """Every point ran, so pandas made the error column float: the calibration's message must still fit."""
    from sim.calibrate import report
    from sim.errors import SimError

    cal = load_calibration(None)
    table = validate(["flash-opt-compute"], decode_tokens=int(cal.meta["decode_tokens"]))
    assert table["error"].isna().all()

    def refuse(*_args, **_kwargs):
        raise SimError("no field 'duration' at drift", field="preset.drift.duration")

    monkeypatch.setattr(report, "predict", refuse)
    row = calibrated_table(table, cal, decode_tokens=int(cal.meta["decode_tokens"]), folds=False).iloc[0]
    assert row["status"] == "failed" and row["error"].startswith("with the calibration:")
    assert "preset.drift.duration" in row["error"]
