"""Sweep results as a heatmap of one metric over two sweep axes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from sim.errors import SimError
from sim.plots.style import _new_axes, _require, add_caption, metric_label
from sim.units import parse_bytes


def _ordered_levels(values: pd.Series) -> list[object]:
    """Distinct axis values in a natural order: by number, by byte size, else first seen."""
    levels = list(dict.fromkeys(values.tolist()))
    numeric = pd.to_numeric(pd.Series(levels, dtype=object), errors="coerce")
    if len(levels) and not numeric.isna().any():
        return [levels[i] for i in np.argsort(numeric.to_numpy(dtype=float), kind="stable")]
    if all(isinstance(v, str) for v in levels):
        try:
            sizes = [parse_bytes(v) for v in levels]
        except SimError:
            return levels
        return [levels[i] for i in np.argsort(sizes, kind="stable")]
    return levels


def plot_sweep_heatmap(df: pd.DataFrame, x: str, y: str, value: str = "decode_tokens_per_s", *,
                       agg: str = "mean", ax: Axes | None = None, title: str | None = None,
                       caption: str | None = None, cmap: str = "viridis") -> Axes:
    """A metric over two sweep axes: one annotated cell per (x, y), ``agg`` over the rest.

    ``df`` is tidy: axis columns plus metric columns, one row per run (a sweep's results;
    rows whose ``status`` is not ``ok`` are left out). Several rows in one cell (seeds, or
    axes not shown) are combined with ``agg`` (``mean``, ``min``, ``max``, ``median``).
    Numeric axes and sizes such as ``8GB`` are ordered by value, other labels as first seen.
    """
    _require(df, (x, y, value), "plot_sweep_heatmap")
    data = df[df["status"] == "ok"] if "status" in df.columns else df
    if data.empty:
        raise SimError("no successful rows to plot", field=value)
    data = data.assign(_v=pd.to_numeric(data[value], errors="coerce"), _x=data[x].astype(object),
                       _y=data[y].astype(object))
    xs, ys = _ordered_levels(data["_x"]), _ordered_levels(data["_y"])
    grid = data.groupby(["_y", "_x"], sort=False)["_v"].agg(agg).unstack("_x").reindex(index=ys, columns=xs)
    values = grid.to_numpy(dtype=float)
    ax = ax if ax is not None else _new_axes((max(4.5, 1.0 * len(xs) + 2.6), max(3.2, 0.55 * len(ys) + 1.9)))
    img = ax.imshow(values, aspect="auto", origin="lower", cmap=cmap)
    several = bool(data.groupby(["_y", "_x"], sort=False).size().gt(1).any())
    ax.figure.colorbar(img, ax=ax, label=metric_label(value) + (f", {agg} per cell" if several else ""))
    tilt = len(xs) > 5
    ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=30 if tilt else 0, ha="right" if tilt else "center",
                  fontsize=8)
    ax.set_yticks(range(len(ys)), [str(v) for v in ys], fontsize=8)
    finite = values[np.isfinite(values)]
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        norm = (values - lo) / (hi - lo) if hi > lo else np.full_like(values, 0.5)
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                if np.isfinite(values[i, j]):
                    ax.text(j, i, f"{values[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if norm[i, j] > 0.55 else "white")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title or f"{metric_label(value)} over {x} x {y}")
    add_caption(ax, caption)
    return ax
