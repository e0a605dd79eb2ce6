"""`sim validate`: every published figure next to the simulator's prediction."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from sim.commands.run_options import run_option
from sim.errors import SimError

if TYPE_CHECKING:
    import pandas as pd


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)


def validate_cmd(
    ids: list[str] = typer.Argument(None, help="Point ids to run (default: all)."),
    decode_tokens: int = run_option("decode_tokens",
                                     help="Decode tokens per point (the default run length, as sim run's)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON rows."),
    csv_out: Path | None = typer.Option(None, "--out", help="Write the table as CSV (.csv)."),
    plot_dir: Path | None = typer.Option(None, "--plot",
                                         help="Folder to write the published-vs-predicted plots (PNG) to."),
    calibration: str | None = typer.Option(None, "--calibration",
                                           help="A calibration file (`sim calibrate --out`) to apply (default: the "
                                                "bundled validation/calibration.yaml): adds each point's error "
                                                "uncalibrated, in-sample and cross-validated; none: no calibration."),
) -> None:
    """Run the published points (validation/published.yaml) and report the error."""
    from sim.outputs import check_output, json_text
    from sim.validation import FAILED, NOT_MODELLED, check_decode_tokens, check_ids, validate

    # Everything a user can get wrong fails here, before the table (seconds to minutes) runs.
    check_ids(ids or None)
    check_decode_tokens(decode_tokens)
    check_output(csv_out, "--out", suffixes=(".csv",))
    check_output(plot_dir, "--plot", directory=True)

    from sim.calibrate.calibration import load_calibration

    cal = load_calibration(calibration)  # a bad file fails before the table runs
    df = validate(ids or None, decode_tokens=decode_tokens)
    cv_mapes = None
    if cal is not None:
        from sim.calibrate.report import calibrated_table, mapes

        df = calibrated_table(df, cal, decode_tokens=decode_tokens)
        cv_mapes = {**mapes(df), "calibration": cal.source}
    if csv_out is not None:
        df.to_csv(csv_out, index=False)
    written = []
    if plot_dir is not None:
        from sim.plots import write_validation_plots

        written = write_validation_plots(df, plot_dir, caption=f"sim validate --decode-tokens {decode_tokens}; "
                                         "published figures from validation/published.yaml")
    ok = df["error_pct"].notna()
    mape = float(df.loc[ok, "error_pct"].abs().mean()) if ok.any() else math.nan
    if json_out:
        print(json_text({"points": json.loads(df.to_json(orient="records")), "mape_pct": mape,
                         **({"calibrated": cv_mapes} if cv_mapes else {})}))
    else:
        table = Table("id", "source", "device", "model", "strategy", "setting", "metric", "published", "predicted",
                      "error %", title=f"published vs predicted ({decode_tokens} decode tokens a point)")
        if cv_mapes:
            for column in ("uncalibrated %", "in-sample %", "cross-validated %"):
                table.add_column(column)
        for row in df.to_dict("records"):
            status = row.get("status")
            if status == NOT_MODELLED:  # a figure kept for the record: say so, not "failed"
                predicted, error = "not modelled", str(row.get("error", "")).removeprefix("not modelled: ")
            elif status == FAILED:
                predicted, error = "failed", str(row.get("error", ""))
            else:
                mark = "" if row.get("within_tolerance") else " *"
                predicted, error = f"{row['predicted']:.4g}", f"{row['error_pct']:+.1f}{mark}"
            cells = [row["id"], row["source"], row["device"], row["model"], row["strategy"],
                     _setting(row.get("setting")), row["metric"], f"{row['published']:g}", predicted, error]
            if cv_mapes:
                cells += [_pct(row.get(c)) for c in ("error_uncalibrated", "error_in_sample", "error_cv")]
            table.add_row(*cells)
        console = Console(width=200)
        if cv_mapes:  # the headline: the error on points the fit never saw
            def pct(key: str) -> str:
                value = cv_mapes.get(key)
                return "-" if value is None or not math.isfinite(value) else f"{value:.1f}%"

            if cv_mapes["cross_validated"]:
                why = ""
            elif not cv_mapes["points"]:
                why = " (none of the selected points has a prediction)"
            elif not getattr(cal, "folds", None):
                why = " (this calibration has no cross-validation folds: `sim calibrate` without --no-cv makes them)"
            else:
                why = " (none of the selected points is one the calibration was fitted on)"
            console.print(f"cross-validated MAPE {pct('mape_cv_pct')}{why}, in-sample {pct('mape_in_sample_pct')}, "
                          f"uncalibrated {pct('mape_uncalibrated_pct')}, over {cv_mapes['points']} points; "
                          f"calibration {cal.source}", markup=False, highlight=False)
        console.print(table)
        if ok.any():
            console.print(f"mean absolute percentage error: {mape:.1f}% over {int(ok.sum())} points "
                          "(* = outside the point's tolerance)")
        else:
            console.print("mean absolute percentage error: - (no point has a prediction)")
        for source, group in df[ok].groupby(df.loc[ok, "source"].str.extract(r"^(\[\w+\])")[0]):
            console.print(f"  {source}: MAPE {group['error_pct'].abs().mean():.1f}% over {len(group)} points")
        notes = _gap_notes(df[ok])
        if notes:
            console.print("outside tolerance, with what is known about why (known_gap in published.yaml):")
            for line in notes:
                console.print(f"  {line}", markup=False, highlight=False)
        for path in written:
            console.print(f"wrote plot: {path}")
    failed = df.loc[df["status"] == FAILED, "id"].tolist()
    if failed:  # a point that should run could not: the table says why, the exit status says so
        raise SimError(f"{len(failed)} point(s) could not run: {', '.join(failed)} (the table gives each error)")


def _gap_notes(df: pd.DataFrame) -> list[str]:
    """One line per point whose prediction misses its tolerance, or whose note no longer applies.

    A miss with no note is either new or a regression, and says so; a note on a point now
    within tolerance is stale. Either way the table alone tells a reader which errors are
    understood, without the README.
    """
    lines = []
    for row in df.to_dict("records"):
        gap = row.get("known_gap")
        gap = gap if isinstance(gap, str) and gap else None
        if not row["within_tolerance"]:
            lines.append(f"{row['id']}: {gap or 'no known reason recorded (a new point, or a regression)'}")
        elif gap:
            lines.append(f"{row['id']}: now within tolerance; its known_gap no longer applies")
    return lines


def _pct(value: object) -> str:
    return "" if not isinstance(value, float) or value != value else f"{value:+.1f}"


def _setting(value: object) -> str:
    """The budget or offload a point was run at (blank for a failed point's missing value)."""
    return "" if value is None or value != value else str(value)
