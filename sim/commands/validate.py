"""`sim validate`: every published figure next to the simulator's prediction."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)


def validate_cmd(
    ids: list[str] = typer.Argument(None, help="Point ids to run (default: all)."),
    decode_tokens: int = typer.Option(64, "--decode-tokens", help="Decode tokens per point."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON rows."),
    csv_out: Path | None = typer.Option(None, "--out", help="Write the table as CSV."),
    plot_dir: Path | None = typer.Option(None, "--plot",
                                         help="Folder to write the published-vs-predicted plots (PNG) to."),
) -> None:
    """Run the published points (sim/data/validation/published.yaml) and report the error."""
    from sim.validation import validate

    df = validate(ids or None, decode_tokens=decode_tokens)
    if csv_out is not None:
        df.to_csv(csv_out, index=False)
    written = []
    if plot_dir is not None:
        from sim.plots import write_validation_plots

        written = write_validation_plots(df, plot_dir, caption=f"sim validate --decode-tokens {decode_tokens}; "
                                         "published figures from sim/data/validation/published.yaml")
    ok = df["error_pct"].notna()
    mape = float(df.loc[ok, "error_pct"].abs().mean()) if ok.any() else math.nan
    if json_out:
        print(json.dumps({"points": json.loads(df.to_json(orient="records")), "mape_pct": mape}, indent=2))
    else:
        table = Table("id", "source", "device", "model", "strategy", "setting", "metric", "published", "predicted",
                      "error %", title="published vs predicted")
        for row in df.to_dict("records"):
            err = row.get("error_pct")
            mark = "" if row.get("within_tolerance") else " *"
            table.add_row(row["id"], row["source"], row["device"], row["model"], row["strategy"],
                          _setting(row.get("setting")),
                          row["metric"], f"{row['published']:g}",
                          "failed" if err != err else f"{row['predicted']:.4g}",
                          (row.get("error", "") if err != err else f"{err:+.1f}{mark}"))
        console = Console(width=200)
        console.print(table)
        console.print(f"mean absolute percentage error: {mape:.1f}% over {int(ok.sum())} points "
                      "(* = outside the point's tolerance)")
        for source, group in df[ok].groupby(df.loc[ok, "source"].str.extract(r"^(\[\w+\])")[0]):
            console.print(f"  {source}: MAPE {group['error_pct'].abs().mean():.1f}% over {len(group)} points")
        for path in written:
            console.print(f"wrote plot: {path}")
    modelled = df["modelled"].fillna(True).astype(bool) if "modelled" in df.columns else pd.Series(True, df.index)
    if not ok[modelled].all():  # a point that should run could not
        raise typer.Exit(2)


def _setting(value: object) -> str:
    """The budget or offload a point was run at (blank for a failed point's missing value)."""
    return "" if value is None or value != value else str(value)
