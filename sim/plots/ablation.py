"""An ablation ladder as bars, in the style of [PI2] Fig. 14: decode speed per rung, each bar
labelled with the speed-up its mechanism adds over the bar before."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.plots.style import _require, add_caption, metric_label, save_figure, strategy_color

COLUMNS = ("rung", "decode_tokens_per_s", "speedup")


def plot_ablation(df: pd.DataFrame, ax: Axes | None = None, *, strategy: str = "powerinfer2",
                  title: str | None = None, caption: str | None = None) -> Axes:
    """Bars of ``decode_tokens_per_s`` per ``rung`` (in row order, as
    :func:`sim.explore.ablation.run_ladder` returns them), each topped by its step's speed-up."""
    _require(df, COLUMNS, "an ablation plot")
    if ax is None:
        ax = Figure(figsize=(1.2 * len(df) + 2.4, 4.0), layout="constrained").subplots()
    x = range(len(df))
    tps = df["decode_tokens_per_s"].to_numpy(dtype=float)
    bars = ax.bar(x, tps, color=strategy_color(strategy), width=0.6)
    labels = ["" if pd.isna(s) else f"{s:.2f}x" for s in df["speedup"]]
    ax.bar_label(bars, labels=[f"{v:.3g}\n{s}".strip() for v, s in zip(tps, labels, strict=True)], fontsize=8,
                 padding=2)
    ax.set_xticks(list(x), list(df["rung"]))
    ax.set_ylabel(metric_label("decode_tokens_per_s"))
    ax.set_ylim(0, 1.2 * max(tps.max(), 1e-9))
    if title:
        ax.set_title(title, fontsize=10)
    add_caption(ax, caption)
    return ax


def draw_ablation(df: pd.DataFrame, path: str | Path, **kwargs) -> Path:
    """:func:`plot_ablation` written to ``path`` (.png, .pdf or .svg)."""
    return save_figure(plot_ablation(df, **kwargs).figure, path)
