"""Figures of sweep results: a metric against one axis, one line per hue (the heatmap is sim.plots.sweeps).

It takes the tidy results DataFrame of :func:`sim.explore.sweep.run_sweep` and uses only
its ``ok`` rows. Axis values written as sizes (``8GB``) are placed by their byte count,
numbers by value, anything else in order of first appearance. Several rows per plotted
cell (seeds, axes not plotted) are averaged; line plots shade their min-max range.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from sim.errors import SimError
from sim.explore.worker import TIMING_COLUMNS
from sim.units import format_bytes, parse_bytes

# Column families a listing shows by prefix only (there are dozens of them).
_GROUPS = ("knobs.", "memory.", "utilisation.", "phases_")


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df else df


def _check_columns(df: pd.DataFrame, names: dict[str, str | None]) -> None:
    for option, col in names.items():
        if col is not None and col not in df.columns:
            shown = [c for c in df.columns if not c.startswith(_GROUPS)]
            raise SimError(f"no column {col!r} in the results; columns include: {', '.join(shown)}", field=option)


def check_axis(df: pd.DataFrame, column: str | None, flag: str) -> None:
    """An axis or hue column must have a value in some successful row, else every point
    collapses onto one unlabelled line (a run option left at its default is ``None``)."""
    if column is None or _ok_rows(df)[column].notna().any():
        return
    data = _ok_rows(df)
    measured = set(TIMING_COLUMNS) | {"point_id", "error", "status"}
    varying = [str(c) for c in data.columns if str(c) not in measured and data[c].dtype.kind != "f"
               and not str(c).startswith(_GROUPS[1:]) and data[c].notna().all() and data[c].astype(str).nunique() > 1]
    raise SimError(f"{column!r} has no value in any successful row (left at its default); columns that vary: "
                   f"{', '.join(varying) or '(none)'}", field=flag)


def averaged_settings(df: pd.DataFrame, shown: list[str | None]) -> list[str]:
    """Run settings that differ between the successful rows yet are not among ``shown`` (the
    plot's axes): their rows share cells and are averaged. Seeds are meant to be; anything
    else (a model, a token count, a knob) usually means the file mixes several sweeps."""
    from sim.explore.store import CONFIG_COLUMNS

    data = _ok_rows(df)
    keys = [c for c in dict.fromkeys(shown) if c is not None and c in data.columns]
    candidates = [c for c in data.columns if (c in CONFIG_COLUMNS or str(c).startswith("knobs."))
                  and c not in keys and c != "seed"]
    if data.empty or not candidates:
        return []
    text = data[candidates].astype(str)  # None and NaN compare as values: a knob one strategy lacks
    cells = [data[k].astype(str) for k in keys] if keys else [pd.Series(0, index=data.index)]
    spread = text.groupby(cells).nunique(dropna=False).max()  # values per column in the busiest cell
    mixed = [str(c) for c in candidates if spread[c] > 1]
    if "strategy" in mixed:  # each strategy has its own knobs: naming them all says nothing more
        mixed = [c for c in mixed if not c.startswith("knobs.")]
    return mixed


def numeric_columns(df: pd.DataFrame) -> list[str]:
    """Columns with a number in at least one successful row (what a metric axis can show)."""
    data = _ok_rows(df)
    out = []
    for col in data.columns:
        s = data[col]
        if s.dtype.kind == "b" or s.map(lambda v: isinstance(v, bool)).any():
            continue
        if pd.to_numeric(s, errors="coerce").notna().any() and pd.to_numeric(s.dropna(), errors="coerce").notna().all():
            out.append(str(col))
    return out


def check_metric(df: pd.DataFrame, column: str, flag: str) -> None:
    """A metric must be numeric, with a value in some successful row: else the plot is empty.

    The error lists what can be plotted (groups such as ``memory.*`` by their prefix).
    """
    _check_columns(df, {flag: column})
    allowed = numeric_columns(df)
    if column in allowed:
        return
    why = "has no value in any successful row" if column in df.columns and not _ok_rows(df)[column].notna().any() \
        else "is not numeric"
    shown = [c for c in allowed if not c.startswith(_GROUPS)]
    groups = sorted({g + "*" for c in allowed for g in _GROUPS if c.startswith(g)})
    raise SimError(f"{column!r} {why}; numeric columns: {', '.join(shown)}"
                   + (f" (and {', '.join(groups)})" if groups else ""), field=flag)


def axis_values(s: pd.Series) -> tuple[pd.Series, str]:
    """(numeric position per row, kind) where kind is ``bytes``, ``number`` or ``category``."""
    values = s.tolist()
    if all(isinstance(v, str) for v in values):
        try:
            return pd.Series([float(parse_bytes(v)) for v in values], index=s.index), "bytes"
        except SimError:
            pass
    numeric = pd.to_numeric(s, errors="coerce")
    if not numeric.isna().any():
        return numeric.astype(float), "number"
    order = {v: i for i, v in enumerate(dict.fromkeys(str(v) for v in values))}
    return pd.Series([float(order[str(v)]) for v in values], index=s.index), "category"


def _labels(s: pd.Series, pos: pd.Series) -> dict[float, str]:
    return {p: str(v) for p, v in zip(pos, s, strict=True)}


def line_plot(df: pd.DataFrame, x: str, y: str, hue: str | None = None, out: str | Path | None = None,
              title: str | None = None) -> Figure:
    """``y`` against ``x``, one line per value of ``hue``; saved to ``out`` when given."""
    _check_columns(df, {"--x": x, "--y": y, "--hue": hue})
    data = _ok_rows(df)
    if data.empty:
        raise SimError("no successful points to plot", field="--y")
    check_metric(df, y, "--y")
    check_axis(df, x, "--x")
    check_axis(df, hue, "--hue")
    pos, kind = axis_values(data[x])
    frame = pd.DataFrame({"x": pos, "y": pd.to_numeric(data[y], errors="coerce"),
                          "hue": data[hue].astype(str) if hue else ""}, index=data.index)
    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for name, grp in frame.groupby("hue", sort=False):
        agg = grp.groupby("x")["y"].agg(["mean", "min", "max"]).sort_index()
        ax.plot(agg.index, agg["mean"], marker="o", markersize=3.5, linewidth=1.6, label=str(name) if hue else None)
        if (agg["max"] > agg["min"]).any():
            ax.fill_between(agg.index, agg["min"], agg["max"], alpha=0.15)
    _format_axis(ax.xaxis, kind, _labels(data[x], pos))
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(True, alpha=0.3)
    if hue:
        ax.legend(title=hue, fontsize=8)
    ax.set_title(title or f"{y} vs {x}")
    if out is not None:
        fig.savefig(out, dpi=120)
    return fig


def _format_axis(axis, kind: str, labels: dict[float, str]) -> None:  # type: ignore[no-untyped-def]
    if kind == "bytes":
        axis.set_major_formatter(FuncFormatter(lambda v, _p: format_bytes(v)))
    elif kind == "category":
        ticks = sorted(labels)
        axis.set_ticks(ticks, [labels[t] for t in ticks])
