"""`sim sweep`: run a design-space sweep from a spec, and plot its results.

``sim sweep SPEC.yaml --out results.parquet`` runs (or resumes) a sweep;
``sim sweep plot results.parquet --x ... --y ... [--hue ...]`` draws a metric against an
axis and ``sim sweep heatmap results.parquet --x ... --y ... --value ...`` over two axes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from sim.errors import SimError, Stopped
from sim.outputs import PLOT_SUFFIXES, check_output, check_suffix

RESULT_SUFFIXES = (".parquet",)  # the store writes Parquet only (its parts, resume and compaction rely on it)
EXIT_FAILED_POINTS = 1


class _SweepGroup(TyperGroup):
    """``sim sweep SPEC ...`` is ``sim sweep run SPEC ...``; ``plot``/``heatmap`` are subcommands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: typer's click Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_SweepGroup, no_args_is_help=True, add_completion=False,
                  help="Run a design-space sweep (sim sweep SPEC.yaml --out results.parquet) and plot its results.")


@app.command("run")
def run(
    spec: Path = typer.Argument(..., help="Sweep spec (YAML): base run, grid / points / sample axes, seeds."),
    out: Path = typer.Option(..., "--out", help="Results file (.parquet); re-running resumes it."),
    workers: int = typer.Option(1, "--workers", help="Local worker processes (or Dask workers with --dask local)."),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler address, e.g. tcp://host:8786."),
    dask: str | None = typer.Option(None, "--dask", help="'local': run on a Dask LocalCluster of --workers."),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Run points recorded as failed again."),
    prune: bool = typer.Option(False, "--prune", help="Drop stored rows of points no longer in the spec."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the spec, list the points and what is left to run; "
                                 "run nothing."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar with ETA."),
    commit_every: float = typer.Option(1.0, "--commit-every", help="Seconds between durable commits of rows "
                                       "(0: each row at once; a crash loses at most this much finished work)."),
) -> None:
    """Run every point of SPEC not yet in --out, in parallel; rows are stored as they finish.

    Every point's options are checked before any point runs. Exit status:

    0: every point of SPEC has a successful row in --out.

    1: some points failed (infeasible, e.g. a budget below what must stay resident); their rows are written.

    2: bad input (a value in SPEC, an option, --out); nothing ran.

    130 (Ctrl-C) or 143 (SIGTERM): stopped; finished rows are saved in --out and the same command resumes.
    """
    from sim.explore.sweep import SweepInterrupted, run_sweep

    if dask is not None and dask != "local":
        raise SimError(f"only 'local' is supported (use --scheduler ADDRESS for a running cluster), got {dask!r}",
                       field="--dask")
    if dask is not None and scheduler is not None:
        raise SimError("give either --dask local or --scheduler ADDRESS, not both", field="--dask")
    if not 0 <= commit_every < math.inf:
        raise SimError(f"must be finite and >= 0 seconds, got {commit_every}", field="--commit-every")
    if not spec.is_file():
        raise SimError("is a folder; give a spec file (.yaml)" if spec.is_dir() else "no such spec file",
                       source=str(spec))
    if dry_run:  # writes nothing: the output is only checked for its kind, no folder is made
        check_suffix(out, "--out", RESULT_SUFFIXES)
        _dry_run(spec, out)
        return
    check_output(out, "--out", suffixes=RESULT_SUFFIXES, inputs={"SPEC": spec})
    try:
        report = run_sweep(spec, out, workers=workers, scheduler=scheduler or dask, retry_failed=retry_failed,
                           prune=prune, progress=progress, commit_every_s=commit_every)
    except SweepInterrupted as stop:
        raise Stopped(stop.message, stop.exit_status) from None
    for note in report.notes:
        print(f"note: {note}")
    print(f"sweep {spec.name}: {report.total} points, {report.skipped} already done, {report.ran} run, "
          f"{report.failed} failed, {report.wall_s:.1f} s -> {report.out}")
    if "decode_tokens" in report.results:  # the run length its figures are quoted at
        lengths = sorted({int(n) for n in report.results["decode_tokens"].dropna()})
        print(f"decode tokens per point: {', '.join(map(str, lengths))}")
    if report.failed:
        print(f"error: {report.failed} of {report.total} points failed (rows written to {report.out}; "
              f"--retry-failed runs them again); first failure: {report.first_error}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILED_POINTS)


def _dry_run(spec: Path, out: Path) -> None:
    from sim.explore.point_checks import check_points
    from sim.explore.store import ResultStore
    from sim.explore.sweep import spec_points

    points, source = spec_points(spec)
    check_points(points, source)
    store = ResultStore(out)
    done = store.finished_ids() if out.exists() or store.parts_dir.exists() else set()
    left = [p for p in points if p.id not in done]
    print(f"{len(points)} points, {len(points) - len(left)} already in {out}, {len(left)} to run")
    for p in left[:20]:
        print(f"  {p.id}  {', '.join(f'{k}={v}' for k, v in p.axes.items())}")
    if len(left) > 20:
        print(f"  ... and {len(left) - 20} more")


def _averaged_note(df: Any, shown: list[str | None]) -> None:
    """Say so when rows that differ in a run setting the plot does not show share its cells."""
    from sim.plots.sweep_lines import averaged_settings

    mixed = averaged_settings(df, shown)
    if mixed:
        print(f"note: rows that differ in {', '.join(mixed)} (not on the plot's axes) are averaged together; "
              "plot one of them as an axis, or keep each sweep in its own results file (--prune drops rows "
              "of other specs)", file=sys.stderr)


def _unfinished_note(results: Path) -> None:
    """Say so when the plotted rows include ones a sweep has not merged into ``results`` yet."""
    from sim.explore.store import has_unmerged_parts

    if has_unmerged_parts(results):
        print(f"note: {results} is unfinished: rows not merged yet were read from {results.name}.parts (a sweep "
              "is running or was stopped; run it again to finish)", file=sys.stderr)


@app.command("plot")
def plot(
    results: Path = typer.Argument(..., help="Results file written by sim sweep."),
    x: str = typer.Option(..., "--x", help="Column on the x axis (an axis of the sweep, e.g. memory_budget)."),
    y: str = typer.Option("decode_tokens_per_s", "--y", help="Metric column (numeric)."),
    hue: str | None = typer.Option(None, "--hue", help="One line per value of this column (e.g. strategy)."),
    out: Path | None = typer.Option(None, "--out", help="Figure to write, .png, .pdf or .svg "
                                    "(default: a PNG next to the results)."),
) -> None:
    """Plot a metric against one axis, one line per --hue value (mean, min-max band)."""
    from sim.explore.store import read_results
    from sim.plots.sweep_lines import line_plot

    df = read_results(results)  # first: a default --out goes next to it, and a missing file creates no folder
    target = out or results.with_name(f"{results.stem}_{_slug(y)}_vs_{_slug(x)}.png")
    check_output(target, "--out", suffixes=PLOT_SUFFIXES, inputs={"RESULTS": results})
    line_plot(df, x, y, hue, target)
    print(f"wrote {target}")
    _averaged_note(df, [x, hue])
    _unfinished_note(results)


@app.command("heatmap")
def heatmap_cmd(
    results: Path = typer.Argument(..., help="Results file written by sim sweep."),
    x: str = typer.Option(..., "--x", help="Axis column across."),
    y: str = typer.Option(..., "--y", help="Axis column down."),
    value: str = typer.Option("decode_tokens_per_s", "--value", help="Metric shown in the cells (numeric)."),
    out: Path | None = typer.Option(None, "--out", help="Figure to write, .png, .pdf or .svg "
                                    "(default: a PNG next to the results)."),
) -> None:
    """Heatmap of a metric over two axes (mean per cell)."""
    from sim.explore.store import read_results
    from sim.plots import plot_sweep_heatmap, save_figure
    from sim.plots.sweep_lines import check_metric

    df = read_results(results)
    target = out or results.with_name(f"{results.stem}_{_slug(value)}_{_slug(x)}_x_{_slug(y)}.png")
    check_output(target, "--out", suffixes=PLOT_SUFFIXES, inputs={"RESULTS": results})
    for flag, column in (("--x", x), ("--y", y)):
        if column not in df.columns:
            raise SimError(f"no column {column!r} in {results}; columns: {', '.join(map(str, df.columns))}",
                           field=flag)
    check_metric(df, value, "--value")
    save_figure(plot_sweep_heatmap(df, x, y, value).figure, target)
    print(f"wrote {target}")
    _averaged_note(df, [x, y])
    _unfinished_note(results)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)
