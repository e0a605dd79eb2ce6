"""Validation with a calibration: each point's error uncalibrated, in-sample and cross-validated.

The three are kept apart because they answer different questions. Uncalibrated: what the
microbenchmarks and mechanisms alone predict. In-sample: how well the fitted values
reproduce the points they were fitted on (always flattering). Cross-validated: the error on
a source group the fit never saw, the one figure that says how well the simulator predicts;
it is the headline.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from sim.calibrate.apply import applicable
from sim.calibrate.calibration import Calibration, source_group
from sim.calibrate.evaluator import predict
from sim.errors import SimError

ERROR_COLUMNS = ("error_uncalibrated", "error_in_sample", "error_cv")


def calibrated_table(table: pd.DataFrame, calibration: Calibration, *, decode_tokens: int,
                     folds: bool = True) -> pd.DataFrame:
    """``table`` (from :func:`sim.validation.validate`, uncalibrated) with the three error columns.

    ``predicted`` and ``error_pct`` become the in-sample calibrated figures (what a run with
    this calibration gives); ``error_*`` are percentages. A point no unknown reaches keeps its
    uncalibrated figure in all three. ``folds`` False skips the cross-validated predictions (NaN):
    the in-sample table alone, at the cost of one more run a point.
    """
    from sim.validation import load_points

    points = {str(p["id"]): p for p in load_points()}
    out = table.copy()
    in_sample = calibration.in_sample()
    for col in (*ERROR_COLUMNS, "predicted_uncalibrated", "predicted_cv", "cv_group"):
        out[col] = math.nan if col != "cv_group" else None
    # a table whose points all ran has no error text: pandas made the column float, which would
    # refuse the message of a point the calibration cannot run
    out["error"] = out["error"].astype(object)
    for i, row in out.iterrows():
        point = points.get(str(row["id"]))
        if point is None or row.get("status") != "ok":
            continue
        published = float(row["published"])
        base = float(row["predicted"])
        out.at[i, "predicted_uncalibrated"] = base
        out.at[i, "error_uncalibrated"] = 100 * (base / published - 1)
        reached = applicable(calibration.unknowns, point)
        cv_values = calibration.cross_validated(point) if folds else None
        try:
            fitted = predict(point, in_sample, decode_tokens=decode_tokens) if reached else base
            cv = (predict(point, cv_values, decode_tokens=decode_tokens) if reached and cv_values is not None
                  else (base if cv_values is not None else math.nan))
        except SimError as exc:
            out.at[i, "status"], out.at[i, "error"] = "failed", f"with the calibration: {exc}"
            continue
        out.at[i, "predicted"] = fitted
        out.at[i, "error_pct"] = 100 * (fitted / published - 1)
        out.at[i, "within_tolerance"] = abs(fitted / published - 1) <= float(row["tolerance_pct"]) / 100
        out.at[i, "error_in_sample"] = 100 * (fitted / published - 1)
        out.at[i, "predicted_cv"] = cv
        out.at[i, "error_cv"] = 100 * (cv / published - 1) if math.isfinite(cv) else math.nan
        group = source_group(point)
        out.at[i, "cv_group"] = (group if str(point["id"]) in calibration.points
                                 else f"{group} (not fitted)" if group in calibration.folds else "(not fitted)")
    return out


def mapes(table: pd.DataFrame) -> dict[str, Any]:
    """MAPE of each error column over the same points: those with all three or, when the
    calibration has no cross-validation folds, those with the other two (``mape_cv_pct`` is
    then NaN and ``cross_validated`` false), so the figures side by side compare like with like."""
    cols = list(ERROR_COLUMNS)
    cross_validated = bool(table["error_cv"].notna().any()) if "error_cv" in table else False
    have = table[cols if cross_validated else cols[:2]].notna().all(axis=1)
    n = int(have.sum())
    result: dict[str, Any] = {"points": n, "cross_validated": cross_validated}
    for col in cols:
        usable = n and (cross_validated or col != "error_cv")
        mape = float(table.loc[have, col].abs().mean()) if usable else math.nan
        result[col.replace("error_", "mape_") + "_pct"] = mape
    return result
